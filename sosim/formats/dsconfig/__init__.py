"""DeepSpeed JSON configs <-> scenarios: the user's own ``ds_config.json`` in, a DeepSpeed config out.

In: ``sosim run --ds-config ds.json --model config.json --hardware PROFILE [--gpus N] [--seq S]`` reads a
DeepSpeed 0.19 config (and a Hugging Face ``config.json``, :mod:`sosim.formats.hf_model`) into a scenario dict, with
DeepSpeed's own semantics: its defaults where a key is absent, its batch arithmetic, its validity rules, and
the Hugging Face Trainer's rules for ``"auto"`` values. Every key of the file is accounted for in the report:
mapped (to which scenario key, as which value), defaulted (absent: the value used and why), or ignored (and
why; ``NOT MODELLED`` marks ignored keys that would change the real step).

Out: :func:`ds_config_from_scenario` writes any scenario as a DeepSpeed config (``--emit-ds-config``), keeping
the keys of a base config (the user's file) that the scenario does not decide; the settings a DeepSpeed
config cannot express (the paper's 'ideal' schedules, DPU, GraceAdam, the machine) are listed, not dropped
silently.

What each DeepSpeed key does was read in DeepSpeed's sources (0.19.8, the version of the measured runs, and
0.19.6 at github deepspeedai/DeepSpeed edaa722): ``runtime/config.py`` (batch arithmetic, precision,
clipping), ``runtime/zero/config.py`` and ``runtime/zero/offload_config.py`` (the ZeRO keys, their defaults
and validators), ``runtime/engine.py`` (``_configure_zero_optimizer``: which optimizer class each setting
selects; ``get_optimizer_configuration``: DeepSpeedCPUAdam vs ``torch_adam``), ``runtime/superoffload/``
(the SuperOffload worker and its core split), and ``transformers/integrations/deepspeed.py``
(``HfTrainerDeepSpeedConfig``: how the Trainer fills ``"auto"``).

The package, one job per module: :mod:`sosim.formats.dsconfig.read` (DeepSpeed JSON -> scenario, with its
report; its parts: :mod:`sosim.formats.dsconfig.mapper`, the reader's state and notes, and
:mod:`sosim.formats.dsconfig.read_training`, precision / batch / clipping / checkpointing),
:mod:`sosim.formats.dsconfig.emit` (scenario -> DeepSpeed JSON) and :mod:`sosim.formats.dsconfig.cli` (the ``sosim
run`` arguments and hooks); the reader's, emitter's and CLI's public names are re-exported here. DeepSpeed's key
names, defaults and the reasons keys are ignored, as data, are :mod:`sosim.schedules.blocks.ds_schema`, beside the
systems whose DeepSpeed forms read them. What is particular to one system (which configs run it, its keys, its
writing) is that system's DeepSpeed form, asked through the registry (sosim/schedules/registry.py, system_api.py):
this package names no system. """

from __future__ import annotations

from sosim.formats.dsconfig.cli import (
    add_arguments,
    finish_run,
    mapping_from_args,
    scenario_for_run,
    scenario_from_args,
)
from sosim.formats.dsconfig.emit import EmitResult, ds_config_from_scenario, write_ds_config
from sosim.formats.dsconfig.read import DsMapping, RunInputs, load_ds_mapping, map_ds_config, prefetch_layers_for

__all__ = [
    "DsMapping", "EmitResult", "RunInputs", "add_arguments", "ds_config_from_scenario", "finish_run", "load_ds_mapping",
    "map_ds_config", "mapping_from_args", "prefetch_layers_for", "scenario_for_run", "scenario_from_args",
    "write_ds_config",
]
