"""The CPU affinity of every thread of a process, read from /proc (no torch, no imports of this package:
scripts/ds_train_step.py loads this file on its own on the GPU machine)."""

from __future__ import annotations

from pathlib import Path


def thread_affinities(pid: int | str = "self") -> list[dict[str, str]]:
    """Cpus_allowed_list and name of every thread of a process, read from /proc."""
    base = Path(f"/proc/{pid}/task")
    threads: list[dict[str, str]] = []
    if not base.exists():
        return threads
    for task in sorted(base.iterdir(), key=lambda p: int(p.name)):
        try:
            status = (task / "status").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        allowed = next(
            (line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list")),
            "",
        )
        threads.append({"tid": task.name, "name": name, "cpus_allowed_list": allowed})
    return threads


__all__ = ["thread_affinities"]
