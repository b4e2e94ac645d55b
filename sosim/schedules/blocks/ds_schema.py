"""DeepSpeed's key names, defaults and ignored-key reasons, as data (shared by the reader and the emitter).

It lives beside the systems because each system's DeepSpeed form (``*_ds.py``, ``system_api.py``) reads its
defaults; the DeepSpeed config reader and writer (sosim.formats.dsconfig), a layer above, read it too."""

from __future__ import annotations

from typing import Any

# --------------------------------------------------------------------------------------------------------
# DeepSpeed's schema, as data. Sections built on DeepSpeedConfigModel forbid unknown keys
# (runtime/config_utils.py: ConfigDict(extra="forbid", populate_by_name=True)), so a typo there is an
# error in DeepSpeed and here. Field names and their aliases, read from the pydantic models:
# --------------------------------------------------------------------------------------------------------
SCHEMA_SOURCE = (
    "DeepSpeed 0.19.8 (PyPI sdist; the measured runs' version) and 0.19.6 (github deepspeedai/DeepSpeed "
    "edaa722): runtime/zero/config.py DeepSpeedZeroConfig, runtime/zero/offload_config.py "
    "DeepSpeedZeroOffloadOptimizerConfig / DeepSpeedZeroOffloadParamConfig, runtime/precision_config.py "
    "DeepSpeedBF16Config / DeepSpeedFP16Config"
)
# Known to both versions: the only names the emitter writes.
DS_KEYS: dict[str, frozenset[str]] = {
    "zero_optimization": frozenset({
        "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
        "allgather_partitions", "allgather_bucket_size", "overlap_comm", "load_from_fp32_weights",
        "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size",
        "cpu_offload_param", "cpu_offload_use_pin_memory", "cpu_offload",
        "prefetch_bucket_size", "stage3_prefetch_bucket_size",
        "param_persistence_threshold", "stage3_param_persistence_threshold",
        "model_persistence_threshold", "stage3_model_persistence_threshold",
        "max_live_parameters", "stage3_max_live_parameters",
        "max_reuse_distance", "stage3_max_reuse_distance",
        "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
        "module_granularity_threshold", "stage3_module_granularity_threshold",
        "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
        "allgather_sequential", "stage3_allgather_sequential",
        "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1",
        "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
        "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "memory_efficient_linear",
        "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
        "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module",
    }),
    "zero_optimization.offload_optimizer": frozenset({
        "device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write", "fast_init",
        "ratio", "super_offload", "cpuadam_cores_perc",
    }),
    "zero_optimization.offload_param": frozenset({
        "device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory",
    }),
    "bf16": frozenset({
        "enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
        "bf16_optimizer_states",
    }),
    "fp16": frozenset({
        "enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
        "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads",
    }),
}
# Names only one of the two versions knows: accepted on input (the user's DeepSpeed may be either), never
# emitted. 0.19.8 added compute_grad_norm and parameter_alignment; 0.19.6 still had MiCS and LoCo-ZeRO++.
DS_KEYS_ONE_VERSION: dict[str, frozenset[str]] = {
    "zero_optimization": frozenset({"compute_grad_norm", "parameter_alignment", "zeropp_loco_param",
                                    "mics_shard_size", "mics_hierarchical_params_gather"}),
}
# DeepSpeedZeroConfig fields with an alias: either spelling is accepted (populate_by_name=True).
ZERO_ALIASES = {
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_model_persistence_threshold": "model_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold": "module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params": "use_all_reduce_for_fetch_params",
    "stage3_allgather_sequential": "allgather_sequential",
}
# DeepSpeed's defaults for the keys sosim maps (runtime/zero/config.py, offload_config.py, constants.py).
DS_DEFAULTS: dict[str, Any] = {
    "reduce_bucket_size": 500_000_000, "sub_group_size": 1_000_000_000, "prefetch_bucket_size": 50_000_000,
    "max_live_parameters": 1_000_000_000, "pin_memory": True, "ratio": 1.0, "cpuadam_cores_perc": 0.8,
    "gradient_clipping": 0.0, "gradient_accumulation_steps": 1,
}
BF16_BYTES_PER_ELEMENT = 2  # reduce_bucket_size counts elements; sosim's bucket_mb is MB of bf16 gradients
DEFAULT_SEQ_LEN = 2048  # stated default when --seq is not given (the measured runs' sequence)

# Why each ZeRO key that sosim does not map is ignored. "dp": changes the step only with data parallelism
# (collectives); "stage3": only for stage-3 systems; True: would change the step; False: does not.
_ZERO_IGNORED: dict[str, tuple[str, bool | str]] = {
    "contiguous_gradients": ("gradient buffer layout (memory fragmentation); no modelled effect on time", False),
    "reduce_scatter": ("collective choice for gradient averaging; sosim models ring collectives", "dp"),
    "allgather_partitions": ("collective choice for the parameter refresh; sosim models ring collectives", "dp"),
    "allgather_bucket_size": ("all-gather bucketing; sosim gathers whole units", "dp"),
    "use_multi_rank_bucket_allreduce": ("collective bucketing across ranks; not modelled", "dp"),
    "round_robin_gradients": ("parallel gradient copies across ranks (stage 1/2); not modelled", "dp"),
    "load_from_fp32_weights": ("checkpoint loading only", False),
    "elastic_checkpoint": ("checkpointing only", False),
    "gather_16bit_weights_on_model_save": ("checkpoint saving only", False),
    "stage3_gather_fp16_weights_on_model_save": ("checkpoint saving only (deprecated name)", False),
    "pipeline_loading_checkpoint": ("checkpoint loading only", False),
    "ignore_unused_parameters": ("error handling for unused parameters; no effect on time", False),
    "legacy_stage1": ("the old stage-1 implementation; not modelled", True),
    "log_trace_cache_warnings": ("logging only", False),
    "enable_sanity_checks": ("debugging checks; not modelled (leave them off when timing)", True),
    "memory_efficient_linear": ("stage-3 linear autograd memory; no modelled effect on time", False),
    "override_module_apply": ("stage-3 nn.Module.apply hook at model construction; not in the step", False),
    "save_muon_momentum_buffer_in_memory": ("Muon optimizer with NVMe only; sosim times Adam", False),
    "leaf_module": ("stage-3 hook granularity for listed module classes; not modelled", "stage3"),
    "module_granularity_threshold": ("stage-3 hook granularity; sosim charges a fixed hook cost per layer",
                                     "stage3"),
    "use_all_reduce_for_fetch_params": ("collective choice for stage-3 parameter fetch; not modelled", "dp"),
    "allgather_sequential": ("per-parameter stage-3 all-gathers; not modelled", "dp"),
    "param_persistence_threshold": ("parameters below it stay unpartitioned on every GPU (norm scales, "
                                    "biases: a small share of the bytes); sosim partitions all", False),
    "model_persistence_threshold": ("upper bound on unpartitioned parameters; see param_persistence_threshold",
                                    False),
    "max_live_parameters": ("a cap on gathered stage-3 parameters; sosim holds the layer in use plus the "
                            "prefetched ones (checked below when it binds)", False),
    "max_reuse_distance": ("keeps a stage-3 parameter gathered when it is reused soon; sosim re-gathers per "
                           "pass", "dp"),
    "zero_hpz_partition_size": ("ZeRO++ hierarchical partitioning (secondary copy of the weights per node); "
                                "modelled for ZeRO-3 without offload only", "dp"),
    "zero_quantized_weights": ("ZeRO++ quantized weight all-gathers; modelled for ZeRO-3 without offload "
                               "only", "dp"),
    "zero_quantized_nontrainable_weights": ("ZeRO++ quantized frozen weights (LoRA); sosim trains all "
                                            "weights", "dp"),
    "zero_quantized_gradients": ("ZeRO++ quantized gradient all-to-all; modelled for ZeRO-3 without offload "
                                 "only", "dp"),
    "zeropp_loco_param": ("LoCo-ZeRO++ error feedback (0.19.6); not modelled", "dp"),
    "mics_shard_size": ("MiCS sharding (0.19.6); not modelled", "dp"),
    "mics_hierarchical_params_gather": ("MiCS (0.19.6); not modelled", "dp"),
    "zenflow": ("ZenFlow (stall-free offload with GPU-side updates of important gradients) is not modelled; "
                "the prediction is for plain ZeRO offload", True),
    "compute_grad_norm": ("stage 1/2 global-norm bookkeeping (0.19.8); sosim's DeepSpeed path always charges "
                          "the CPU unscale pass", False),
    "parameter_alignment": ("16-byte padding of stage 1/2 flat buffers (0.19.8): memory only", False),
}
# Value types of the ZeRO fields (the pydantic annotations): checked even for ignored keys, since DeepSpeed
# rejects a bad value whether or not it matters for speed. "int": a whole number >= 0; "bool": true/false.
_ZERO_TYPES: dict[str, str] = {
    **dict.fromkeys(("reduce_bucket_size", "allgather_bucket_size", "sub_group_size", "prefetch_bucket_size",
                     "param_persistence_threshold", "model_persistence_threshold", "max_live_parameters",
                     "max_reuse_distance", "zero_hpz_partition_size", "module_granularity_threshold"), "int"),
    **dict.fromkeys(("contiguous_gradients", "reduce_scatter", "use_multi_rank_bucket_allreduce",
                     "allgather_partitions", "overlap_comm", "load_from_fp32_weights", "elastic_checkpoint",
                     "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
                     "gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                     "use_all_reduce_for_fetch_params", "allgather_sequential", "ignore_unused_parameters",
                     "legacy_stage1", "round_robin_gradients", "zero_quantized_weights",
                     "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "memory_efficient_linear",
                     "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
                     "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "compute_grad_norm",
                     "parameter_alignment", "mics_hierarchical_params_gather"), "bool"),
}
OFFLOAD_NVME_ONLY = ("nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pipeline_read", "pipeline_write",
                      "fast_init")
# Top-level keys sosim does not map, and why. "enabled": changes the step only when the section is enabled.
TOP_IGNORED: dict[str, tuple[str, bool | str]] = {
    "scheduler": ("learning-rate schedule: no effect on the step time", False),
    "steps_per_print": ("logging only", False),
    "wall_clock_breakdown": ("timers that add stream synchronisations; not modelled (leave off when timing)",
                             "true"),
    "memory_breakdown": ("logging only", False),
    "dump_state": ("logging only", False),
    "log_level": ("logging only", False),
    "flops_profiler": ("profiling; not modelled (leave off when timing)", "enabled"),
    "tensorboard": ("monitoring only", False), "wandb": ("monitoring only", False),
    "csv_monitor": ("monitoring only", False), "comet": ("monitoring only", False),
    "comms_logger": ("logging only", False), "timers": ("timer settings; logging only", False),
    "checkpoint": ("checkpointing only", False), "nebula": ("checkpointing only", False),
    "datastates": ("checkpointing only", False),
    "zero_allow_untested_optimizer": ("permission flag; no effect on time", False),
    "communication_data_type": ("dtype of gradient collectives; sosim's collectives move bf16", "dp"),
    "seq_parallel_communication_data_type": ("dtype of sequence-parallel all-to-alls; not modelled", "sp"),
    "prescale_gradients": ("gradient scaling before all-reduce; no modelled effect", False),
    "gradient_predivide_factor": ("gradient scaling before all-reduce; no modelled effect", False),
    "gradient_allreduce_op": ("sum or mean for gradient all-reduce; same time", False),
    "sparse_gradients": ("sparse embedding gradients; not modelled", "true"),
    "disable_allgather": ("legacy collective switch; not modelled", "dp"),
    "data_types": ("grad_accum_dtype / param_dtype: fp32 gradient accumulation is not modelled", True),
    "amp": ("NVIDIA apex AMP (not usable with ZeRO); not modelled", "enabled"),
    "torch_autocast": ("torch autocast instead of bf16/fp16 master copies; not modelled", "enabled"),
    "compile": ("torch.compile / DeepCompile; not modelled (sosim's constants are for eager PyTorch)",
                "enabled"),
    "aio": ("async I/O settings; used with NVMe offload (block_size, queue_depth, intra_op_parallelism)", False),
    "elasticity": ("elastic batch sizes; the batch keys given are used as they are", "enabled"),
    "pipeline": ("pipeline parallelism (PipelineModule); not modelled", True),
    "autotuning": ("the DeepSpeed autotuner's settings; no effect on a run", False),
    "sparse_attention": ("block-sparse attention; sosim models dense attention", True),
    "progressive_layer_drop": ("layer dropping; not modelled", "enabled"),
    "curriculum_learning": ("sequence-length curriculum; the prediction is for --seq", "enabled"),
    "data_efficiency": ("data sampling/routing; not modelled", "enabled"),
    "eigenvalue": ("eigenvalue computation; not modelled", "enabled"),
    "quantize_training": ("quantized training; not modelled", "enabled"),
    "compression_training": ("compression; not modelled", True),
    "hybrid_engine": ("RLHF generation engine; not modelled", "enabled"),
    "dataloader_drop_last": ("data loading only", False),
    "vocabulary_size": ("a warning check only (runtime/config.py)", False),
    "graph_harvesting": ("CUDA-graph capture; not modelled", "true"),
    "weight_quantization": ("weight quantization; not modelled", True),
    "tensor_parallel": ("AutoTP tensor parallelism; not modelled", True),
    "expert_parallel": ("expert parallelism (MoE); not modelled", True),
    "use_data_before_expert_parallelism": ("MoE process-group layout; not modelled", False),
    "managed_gradient_accumulation": ("who owns the accumulation boundary; same work", False),
}
# Keys the mapper reads (top level); everything else is looked up in TOP_IGNORED.
TOP_MAPPED = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
               "gradient_clipping", "bf16", "bfloat16", "fp16", "zero_optimization", "optimizer",
               "zero_force_ds_cpu_optimizer", "activation_checkpointing", "sequence_parallel_size")
ACT_CKPT_KEYS = {
    "partition_activations": ("splits checkpoints across tensor-parallel ranks; no effect without TP", False),
    "cpu_checkpointing": ("moves activation checkpoints to CPU memory; not modelled outside SuperOffload's "
                          "weight-flow", True),
    "contiguous_memory_optimization": ("checkpoint buffer layout; memory only", False),
    "number_checkpoints": ("buffer count for contiguous checkpoints; memory only", False),
    "synchronize_checkpoint_boundary": ("a stream synchronisation per checkpoint; not modelled", True),
    "profile": ("profiling only", False),
}
ADAM_TYPES = ("adam", "adamw")

MISSING = object()
