"""Host time of DeepSpeed stage 3's module hooks inside real steps (no torch import here; issue 21 item 2).

DeepSpeed 0.18.x / 0.19.x (``deepspeed/runtime/zero/parameter_offload.py``, DeepSpeedZeRoOffload) registers, on
every module of the model (``_register_deepspeed_module`` recurses through all children, containers included),
four hooks: a forward pre-hook (``_pre_forward_module_hook`` -> ``pre_sub_module_forward_function`` -> the
coordinator's ``fetch_sub_module``), a forward hook (``_post_forward_module_hook`` -> ``release_sub_module``), a
forward hook that wraps the outputs in an autograd function whose backward runs ``pre_sub_module_backward_function``
(fetch again for backward) and a forward pre-hook that wraps the inputs so that ``post_sub_module_backward_function``
(release after backward) runs. The coordinator (``partitioned_param_coordinator.py``,
PartitionedParameterCoordinator) fetches and releases per parameter of the module.

What is timed (perf_counter, per step sums and call counts, no synchronisation added):

- ``hook_*``: the four registered closures themselves, swapped in place in the module's hook dictionaries
  (``handle.hooks_dict_ref()[handle.id]``): everything a hook costs on the host, autograd wrapping included.
  ``hook_fwd_pre`` contains ``pre_fwd`` which contains ``fetch`` (forward side); the names nest, they do not add.
- ``pre_fwd`` / ``post_fwd`` / ``pre_bwd`` / ``post_bwd``: DeepSpeedZeRoOffload's four methods (instance
  attributes shadow them: the closures look them up on ``self`` at each call). ``pre_bwd`` and ``post_bwd`` run
  inside autograd's backward.
- ``fetch`` / ``release``: the coordinator's ``fetch_sub_module`` / ``release_sub_module`` (all-gather launch,
  waits on in-flight gathers, prefetch; release frees the gathered data).

Why both the closures and the methods: the model must tell what follows the number of modules (every hook
call) from what follows the number of parameter tensors (the coordinator's per-parameter work), so the row
also records the hooked modules, the modules that hold parameters and the parameter tensors
(:func:`model_counts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Why no import of ds_timers: scripts load this file alone (no package), so the caller passes a
# ds_timers.MethodTimers in (anything with wrap_callable() and take()).
MethodTimers = Any

# DeepSpeedZeRoOffload methods -> short names (CSV columns t_<short>_s, n_<short>).
OFFLOAD_METHODS: dict[str, str] = {
    "pre_sub_module_forward_function": "pre_fwd",
    "post_sub_module_forward_function": "post_fwd",
    "pre_sub_module_backward_function": "pre_bwd",
    "post_sub_module_backward_function": "post_bwd",
}
COORDINATOR_METHODS: dict[str, str] = {"fetch_sub_module": "fetch", "release_sub_module": "release"}
# The registered closures in the order _register_deepspeed_module appends them (parameter_offload.py, 0.18.8 and
# 0.19.8): forward_hooks gets [pre-hook, forward hook] per module, backward_hooks [forward hook that wraps the
# outputs for pre-backward, pre-hook that wraps the inputs for post-backward] per module. Why by position and not
# by __name__: @instrument_w_nvtx wraps _post_forward_module_hook without functools.wraps (its name is wrapped_fn).
FORWARD_HOOKS: tuple[str, str] = ("hook_fwd_pre", "hook_fwd_post")
BACKWARD_HOOKS: tuple[str, str] = ("hook_bwd_pre_setup", "hook_bwd_post_setup")
HOOK_NAMES: tuple[str, ...] = (
    *FORWARD_HOOKS,
    *BACKWARD_HOOKS,
    *OFFLOAD_METHODS.values(),
    *COORDINATOR_METHODS.values(),
)


def find_offload(engine: Any) -> Any | None:
    """The engine's DeepSpeedZeRoOffload (stage 3 and SuperOffload), or None (stage 1/2, no DeepSpeed)."""
    optimizer = getattr(engine, "optimizer", None)
    offload = getattr(optimizer, "parameter_offload", None)
    if offload is None:
        offload = getattr(engine, "parameter_offload", None)
    return offload


def _wrap_methods(timers: MethodTimers, obj: Any, names: dict[str, str]) -> list[str]:
    done = []
    for attr, short in names.items():
        method = getattr(obj, attr, None)
        if method is None or not callable(method):
            continue
        setattr(obj, attr, timers.wrap_callable(short, method))
        done.append(short)
    return done


def _wrap_handles(timers: MethodTimers, handles: Iterable[Any], names: tuple[str, str]) -> int:
    """Swap each registered hook closure for a timed wrapper in its module's hook dict (handles alternate
    between the two kinds of ``names``); returns how many were swapped."""
    count = 0
    for index, handle in enumerate(handles):
        ref = getattr(handle, "hooks_dict_ref", None)
        hooks = ref() if callable(ref) else None
        key = getattr(handle, "id", None)
        if hooks is None or key not in hooks:
            continue
        hooks[key] = timers.wrap_callable(names[index % 2], hooks[key])
        count += 1
    return count


class HookTimers:
    """Stage 3's hook work, timed per step: ``attach(engine)`` once after deepspeed.initialize, ``take()`` per
    step (as :class:`MethodTimers`)."""

    def __init__(self, timers: MethodTimers) -> None:
        self.timers = timers
        self.wrapped: list[str] = []
        self.hook_handles = 0
        self.registered_modules = 0  # modules DeepSpeed hooked: a ZeRO-3 leaf module's children are not
        self.attached = False

    def attach(self, engine: Any) -> bool:
        offload = find_offload(engine)
        if offload is None:
            return False
        self.wrapped += _wrap_methods(self.timers, offload, OFFLOAD_METHODS)
        coordinator = offload.get_param_coordinator() if hasattr(offload, "get_param_coordinator") else None
        if coordinator is not None:
            self.wrapped += _wrap_methods(self.timers, coordinator, COORDINATOR_METHODS)
        # Two forward hooks per registered module (_register_deepspeed_module). Why count them: DeepSpeed 0.18.8 /
        # 0.19.8 flag some classes as ZeRO-3 leaf modules by default (runtime/zero/leaf_module_config.py:
        # Mixtral's, Qwen2-MoE's and Qwen3-MoE's SparseMoeBlock), fetched whole, their children not hooked.
        self.registered_modules = len(getattr(offload, "forward_hooks", [])) // 2
        self.hook_handles = _wrap_handles(self.timers, getattr(offload, "forward_hooks", []), FORWARD_HOOKS)
        self.hook_handles += _wrap_handles(self.timers, getattr(offload, "backward_hooks", []), BACKWARD_HOOKS)
        self.attached = True
        return True

    def take(self) -> dict[str, tuple[float, int]]:
        return self.timers.take()


def model_counts(module: Any) -> dict[str, int]:
    """hooked_modules (every module: DeepSpeed hooks them all), param_modules (modules holding parameters of their
    own) and param_tensors, counted on a torch module (anything with modules() / parameters(recurse=))."""
    modules = list(module.modules())
    holding = [m for m in modules if any(True for _ in m.parameters(recurse=False))]
    tensors = sum(1 for _ in module.parameters())
    leaves = sum(1 for m in modules if getattr(m, "_z3_leaf", False))  # DeepSpeed's flag (utils/z3_leaf_module.py)
    return {"hooked_modules": len(modules), "param_modules": len(holding), "param_tensors": tensors,
            "z3_leaf_modules": leaves}
