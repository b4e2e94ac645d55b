"""A fingerprint of what an engine runs: the node plan and its contention, as a 32-byte digest.

An engine (:data:`sosim.run.simulate.ENGINES`) is a pure function of the node plan and the contention it
is handed: two runs whose inputs serialize alike return the same starts, ends and stretch, bit for bit. Many
of a search's candidates build the same plan (a knob that changes nothing on that structural point: ZeRO's
``overlap_comm`` where nothing overlaps, a ``sub_group_elements`` above the parameter count), so a search
keyed on this fingerprint runs each distinct plan once (``sosim.answers.tune.candidate_eval``).

What is serialized (every value an engine can read, exactly: floats by their 8 bytes, so ``0.0`` and
``-0.0`` differ):

* the plan: for a repeated plan (``Plan.repeat``, whether its ``ops`` were made or not), its one-iteration
  template (every op's resource kind and instance, duration, dependencies including carry slots, layer,
  category, phase, bytes, FLOPs, group), the template's iteration starts, carry lags and carry-outs, and the
  number of copies (the run is a function of these: ``Plan.repeat``); for any other plan (a node plan of
  several ranks), the same fields of every op plus ``iteration``, and the iteration starts;
* the contention: resource names, capacities, every op's demands (sorted by op id; those of a repeated
  plan as its template's, with the period and the number of copies, which determine them), ``stands_for``
  and ``report_as``;
* the engine's name.

Left out: op names. They are labels for humans (sosim/engine/plan.py: "never parsed"); an engine reads one
only to name an op in the error it raises when a plan cannot run, and an error is never reused.

The serialization is injective (``marshal`` format 2 of nested tuples of ints, floats and bytes: no
references between objects, so equal values give equal bytes whatever objects hold them, and a type tag on
every value). The digest is BLAKE2b-256: two different inputs share it with probability ~2^-128 over any
search (birthday bound), far below any other error in the model; it is kept instead of the bytes themselves
because a table of several thousand plans of a few thousand ops would hold hundreds of MB.
"""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Iterable

from sosim.engine.fluid import Contention, RepeatedUses
from sosim.engine.plan import Category, Op, Phase, Plan, ResourceKind

# Small ints for the enums (marshal of a str depends on whether it is interned; an int does not).
_KIND = {k: i for i, k in enumerate(ResourceKind)}
_CATEGORY = {c: i for i, c in enumerate(Category)}
_PHASE = {p: i for i, p in enumerate(Phase)}
MARSHAL_VERSION = 2  # no object references (version 3 adds them: identity would reach the bytes)


def _ops(ops: Iterable[Op], with_iteration: bool) -> tuple[tuple[object, ...], ...]:
    kind, category, phase = _KIND, _CATEGORY, _PHASE
    if with_iteration:
        return tuple([(kind[o.resource.kind], o.resource.instance, o.duration_s, o.deps, o.layer, o.iteration,
                       category[o.category], phase[o.phase], o.n_bytes, o.flops, o.group) for o in ops])
    return tuple([(kind[o.resource.kind], o.resource.instance, o.duration_s, o.deps, o.layer,
                   category[o.category], phase[o.phase], o.n_bytes, o.flops, o.group) for o in ops])


def plan_data(plan: Plan) -> tuple[object, ...]:
    """The plan as nested tuples of ints and floats (what :func:`engine_fingerprint` serializes)."""
    t = plan.template
    if t is not None:  # a repeated plan, its ops made or not: they are a function of these (Plan.repeat)
        return ("repeat", plan.copies, _ops(t.ops, with_iteration=False), tuple(t.iteration_starts),
                tuple(sorted(t.lag.items())), tuple(sorted(t.carry_out.items())))
    return ("ops", _ops(plan.ops, with_iteration=True), tuple(plan.iteration_starts))


def contention_data(contention: Contention | None) -> tuple[object, ...]:
    """The contention as nested tuples (None: nothing shared)."""
    if contention is None:
        return ("none",)
    uses = contention.uses
    # A repeated plan's demands by its template (they are the same for every copy, RepeatedUses), else by op id.
    demands = ("repeated", uses.period, uses.copies, tuple(sorted(uses.template.items()))) \
        if isinstance(uses, RepeatedUses) else ("by_op", tuple(sorted(uses.items())))
    return ("contention", tuple(n.encode() for n in contention.names), tuple(contention.capacity),
            demands, contention.stands_for, tuple(sorted(contention.report_as.items())))


def engine_fingerprint(plan: Plan, contention: Contention | None, engine: str) -> bytes:
    """The digest of what ``engine`` runs for ``plan`` and ``contention`` (see the module docstring)."""
    data = (engine.encode(), plan_data(plan), contention_data(contention))
    # typeshed's marshal types do not nest tuples of objects; the values are ints, floats and bytes.
    return hashlib.blake2b(marshal.dumps(data, MARSHAL_VERSION), digest_size=32).digest()  # type: ignore[arg-type]


__all__ = ["contention_data", "engine_fingerprint", "plan_data"]
