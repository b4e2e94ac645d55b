"""Cost model backed by a measured calibration table, with the analytic model as the fallback.

A profile names its table with ``calibration: <csv>``. For each cost the table is asked first (a whole
measured layer, else its measured GEMMs and attention, a measured copy, CPU Adam or cast); anything the
table does not cover — a shape or size outside the measurements, an implementation never timed — falls
back to :class:`~sosim.costs.AnalyticCostModel`. The table's SHA-256 goes into every result's provenance,
with how many lookups were answered by measurements.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from sosim import model as tm
from sosim.calibration_table import CalibrationError, CalibrationTable
from sosim.config import AdamImpl
from sosim.costs import CAUSAL_WORK_FRACTION, AnalyticCostModel, CollectiveKind, Direction, stage3_variant
from sosim.errors import ConfigError

# sosim's CPU-Adam names -> the implementations the harness times.
_ADAM_IMPL: dict[str, str] = {"torch": "torch", "cpu_adam": "deepspeed"}


@functools.lru_cache(maxsize=16)
def _read_table(path: str, mtime_ns: int, size: int) -> CalibrationTable:
    """Parse a table once per file version (a pure memo: the key includes the file's mtime and size)."""
    del mtime_ns, size  # part of the cache key only
    return CalibrationTable.from_csv(path)


def load_table(path: str) -> CalibrationTable:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError([f"{path}: calibration table cannot be read: {exc.strerror or exc}"]) from None
    try:
        return _read_table(path, st.st_mtime_ns, st.st_size)
    except CalibrationError as exc:
        raise ConfigError([f"calibration table: {exc}"]) from None


@dataclass(frozen=True)
class TableCostModel:
    analytic: AnalyticCostModel
    table: CalibrationTable
    # Lookups answered by measurements vs by the analytic fallback (for provenance only).
    _hits: dict[str, int] = field(default_factory=lambda: {"measured": 0, "fallback": 0}, compare=False)

    @classmethod
    def from_profile(cls, analytic: AnalyticCostModel) -> TableCostModel:
        path = analytic.hw.calibration
        assert path is not None
        return cls(analytic, load_table(path))

    def _pick(self, measured: float | None, fallback: float) -> float:
        if measured is None:
            self._hits["fallback"] += 1
            return fallback
        self._hits["measured"] += 1
        return measured

    # --- GPU -------------------------------------------------------------------------------------------
    @functools.cached_property
    def _shape(self) -> tuple[int, int, int, int, int]:
        a = self.analytic
        m, t = a.model, a.training
        batch = max(1, a.tokens_per_gpu // t.seq_len)
        return m.hidden, t.seq_len, batch, m.heads, m.hidden // m.heads

    def _gemms_s(self) -> float:
        a = self.analytic
        t = a.tokens_per_gpu
        total = 0.0
        for g in tm.layer_gemms(a.model):
            total += self._pick(self.table.gemm_time_s(t, g.n_out, g.k_in), a.gemm_s(g.flops(t)))
        return total

    def _attention_s(self, backward: bool) -> float:
        _, seq, batch, heads, head_dim = self._shape
        a = self.analytic
        fwd_flops = tm.attention_flops_fwd(a.model, a.tokens_per_gpu, seq) * CAUSAL_WORK_FRACTION
        fwd_analytic = fwd_flops / (a.hw.gpu.peak_bf16_tflops * 1e12 * a.hw.gpu.attention_efficiency)
        fwd = self._pick(self.table.attention_time_s(batch, seq, heads, head_dim, backward=False), fwd_analytic)
        if not backward:
            return fwd
        both = self.table.attention_time_s(batch, seq, heads, head_dim, backward=True)
        return self._pick(None if both is None else both - fwd, a.hw.gpu.attention_bwd_factor * fwd_analytic)

    def _measured_layer(self, backward: bool) -> float | None:
        a = self.analytic
        if a.model.ffn_kind != "swiglu":  # the harness times Llama-style layers only
            return None
        hidden, seq, batch, _, _ = self._shape
        return self.table.layer_time_s(hidden, seq, batch, backward=backward)

    def layer_fwd_s(self) -> float:
        measured = self._measured_layer(backward=False)
        if measured is not None:
            return self._pick(measured, 0.0)
        _, _, elem, over = self.analytic._layer_parts_s
        return self._gemms_s() + self._attention_s(backward=False) + elem + over

    def layer_bwd_s(self) -> float:
        both = self._measured_layer(backward=True)
        fwd = self.layer_fwd_s()
        if both is not None:
            bwd = self._pick(both - fwd, 0.0)
        else:
            _, _, elem, over = self.analytic._layer_parts_s
            bwd = 2.0 * self._gemms_s() + self._attention_s(backward=True) + 2.0 * elem + 2.0 * over
        if self.analytic.training.activation_checkpointing:
            bwd += fwd
        return bwd

    def head_fwd_s(self) -> float:
        return self.analytic.head_fwd_s()

    def head_bwd_s(self) -> float:
        return self.analytic.head_bwd_s()

    def gpu_adam_s(self, params: float) -> float:
        return self.analytic.gpu_adam_s(params)

    def gpu_cast_s(self, elements: float) -> float:
        measured = self.table.cast_time_s(elements, "gpu", "bf16", None)
        return self._pick(measured, self.analytic.gpu_cast_s(elements))

    # --- host link -----------------------------------------------------------------------------------------
    def copy_s(self, n_bytes: float, direction: Direction, pinned: bool) -> float:
        measured = self.table.copy_time_s(n_bytes, direction, pinned, False)
        return self._pick(measured, self.analytic.copy_s(n_bytes, direction, pinned))

    @functools.cached_property
    def duplex_factors(self) -> dict[str, float]:
        """Measured: each direction's time alone / its time while both directions copy, at 256 MiB."""
        size = 256 * 2**20
        out = dict(self.analytic.duplex_factors)
        for direction in ("h2d", "d2h"):
            alone = self.table.copy_time_s(size, direction, True, False)  # type: ignore[arg-type]
            both = self.table.copy_time_s(size, direction, True, True)  # type: ignore[arg-type]
            if alone is not None and both is not None and both > 0:
                out[direction] = min(1.0, alone / both)
        return out

    # --- CPU -----------------------------------------------------------------------------------------------
    def cpu_adam_s(self, params: float, impl: AdamImpl, cores: float, total_params: float) -> float:
        fallback = self.analytic.cpu_adam_s(params, impl, cores, total_params)
        name = _ADAM_IMPL.get(impl)
        if name is None:
            return self._pick(None, fallback)
        whole = self.table.cpu_adam_time_s(total_params, round(cores), name)  # type: ignore[arg-type]
        return self._pick(None if whole is None else whole * params / total_params, fallback)

    def cpu_cast_s(self, elements: float, cores: float) -> float:
        measured = self.table.cast_time_s(elements, "cpu", "bf16", round(cores))
        return self._pick(measured, self.analytic.cpu_cast_s(elements, cores))

    def cpu_norm_s(self, params: float) -> float:
        return self.analytic.cpu_norm_s(params)

    def collective_s(self, kind: CollectiveKind, n_bytes: float, ranks: int) -> float:
        measured = self.table.collective_time_s(kind, n_bytes, ranks)
        return self._pick(measured, self.analytic.collective_s(kind, n_bytes, ranks))

    def allreduce_s(self, n_bytes: float, ranks: int) -> float:
        return self.collective_s("all_reduce", n_bytes, ranks)

    def reduce_scatter_s(self, n_bytes: float, ranks: int) -> float:
        return self.collective_s("reduce_scatter", n_bytes, ranks)

    def disk_s(self, n_bytes: float, write: bool) -> float:
        return self._pick(self.table.disk_time_s(n_bytes, write), self.analytic.disk_s(n_bytes, write))

    # --- DeepSpeed stage-3 paths -------------------------------------------------------------------------
    def ds_refresh_s(self, elements: float, threads: float, pinned: bool, system: str = "zero3_offload") -> float:
        fallback = self.analytic.ds_refresh_s(elements, threads, pinned, system)
        if pinned:  # the table times DeepSpeed's allocating, pageable path only
            return self._pick(None, fallback)
        return self._pick(self.table.ds_refresh_time_s(elements, threads, stage3_variant(system)), fallback)

    def stage3_hook_s(self, tokens: int, backward: bool) -> float:
        m = self.analytic.model
        fallback = self.analytic.stage3_hook_s(tokens, backward)
        if m.ffn_kind != "swiglu":  # the harness times Hugging Face Llama layers only
            return self._pick(None, fallback)
        found = self.table.stage3_hook_time_s(m.hidden, m.heads, m.n_kv_heads, m.ffn_dim, tokens, backward)
        return self._pick(None if found is None else found[0], fallback)

    def ds_step_fixed_s(self, params: float, subgroups: int, system: str) -> float:
        measured = self.table.ds_step_fixed_time_s(params, subgroups, stage3_variant(system))
        return self._pick(measured, self.analytic.ds_step_fixed_s(params, subgroups, system))

    def so_worker_roundtrip_s(self, elements: float, with_copies: bool = False) -> float:
        measured = self.table.so_worker_time_s(elements, "with_copies" if with_copies else "alone")
        return self._pick(measured, self.analytic.so_worker_roundtrip_s(elements, with_copies))

    @property
    def provenance(self) -> dict[str, str]:
        return {
            "cost_model": "table",
            "profile": self.analytic.hw.name,
            "calibration": str(Path(self.table.path).name),
            "calibration_sha256": self.table.sha256,
            "table_lookups_measured": str(self._hits["measured"]),
            "table_lookups_fallback": str(self._hits["fallback"]),
        }
