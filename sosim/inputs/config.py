"""Validated, typed inputs: hardware profiles, model shape, training settings, schedule, cluster.

Everything here is plain data: constructing a model performs no I/O and touches no global state (the
loader reads files; this module only checks values). Units are in the field names; the conversion to SI
happens in the cost model through :mod:`sosim.inputs.units`.

Every numeric field of a hardware section must name where it came from in that section's ``sources``
mapping (spec sheet, paper, calibration file): a profile without provenance is rejected.

Why this module is over 500 lines: it is the whole validated input schema: Scenario's discriminated unions and
forward references resolve in one namespace, and the provenance rule (_Sourced) applies to every hardware section;
each model is short.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializeAsAny,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from sosim.inputs.bounds import (
    MAX_ADAM_S_PER_GPARAM,
    MAX_GBPS,
    MAX_GPUS,
    MIN_ADAM_S_PER_GPARAM,
    MIN_FRACTION,
    MIN_GBPS,
    CapacityGiB,
    CostRatio,
    Count,
    Efficiency,
    FieldProblem,
    Microseconds,
    PageKiB,
    ReserveGiB,
    Tflops,
    curve_problem,
    field_problem,
)
from sosim.inputs.ds_versions import NEWEST, DeepSpeedVersion

PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
UnitInterval = Annotated[float, Field(ge=0, le=1)]
# A piecewise-linear curve: (x, y) points with strictly increasing x.
Curve = list[tuple[float, float]]

# cpu_adam_sve: DeepSpeedCPUAdam's SVE kernel (DeepSpeed PR 8365; sosim/schedules/blocks/ds_version.py).
AdamImpl = Literal["torch", "cpu_adam", "cpu_adam_sve", "grace_adam"]
# Sanity bounds of the inputs, and the check that numbers are numbers: sosim/inputs/bounds.py (docs/limits.md).
BandwidthGBps = Annotated[float, Field(ge=MIN_GBPS, le=MAX_GBPS)]
GpuCount = Annotated[int, Field(gt=0, le=MAX_GPUS)]

class _Strict(BaseModel):
    """Unknown keys are errors (typos must not be silently ignored); instances are immutable. Numeric fields
    refuse booleans (``layers: true`` is not 1 layer) and integers beyond MAX_INT."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        # A model-level check (a field validator may not touch a tagged union's tag, schedule.system). It runs
        # for every section of every candidate a search builds: plain values are let through first.
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            if value is None or not isinstance(name, str) or isinstance(value, BaseModel):
                continue
            bad = field_problem(cls, name, value)
            if bad is not None:
                raise FieldProblem(name, bad)
        return data


def _check_curve(name: str, curve: Curve, y_max: float | None = None) -> None:
    if not curve:
        raise ValueError(f"{name} needs at least one (x, y) point")
    xs = [x for x, _ in curve]
    if any(b <= a for a, b in itertools.pairwise(xs)):
        raise ValueError(f"{name} x values must be strictly increasing, got {xs}")
    for x, y in curve:
        if x <= 0 or y <= 0:
            raise ValueError(f"{name} points must be positive, got ({x}, {y})")
        if y_max is not None and y > y_max:
            raise ValueError(f"{name} values must be at most {y_max}, got {y}")


def _check_range(field: str, problem: str | None) -> None:
    """A curve outside its physical range (sosim/inputs/bounds.py curve_problem) is a validation error located
    at the curve's key (its line, or the --set that gave it)."""
    if problem is not None:
        raise FieldProblem(field, problem)


class _Sourced(_Strict):
    """A hardware section whose every number names its source."""

    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _every_number_has_a_source(self) -> _Sourced:
        missing = []
        for name, value in self:
            # Defaults are neutral (no effect); only numbers the profile states need a source. A value equal to
            # its default states nothing either (a dumped and re-read profile carries its defaults).
            if name == "sources" or name not in self.model_fields_set:
                continue
            if value == type(self).model_fields[name].default:
                continue
            # Nested sections carry their own sources.
            if isinstance(value, BaseModel) or (isinstance(value, list) and value and isinstance(value[0], BaseModel)):
                continue
            # An empty list or mapping states nothing (a dumped and re-read profile carries its defaults).
            numeric = isinstance(value, (int, float, list, dict)) and not isinstance(value, bool) and value != []
            numeric = numeric and value != {}
            if numeric and value is not None and not self.sources.get(name):
                missing.append(name)
        if missing:
            raise ValueError(f"sources: no source given for {', '.join(sorted(missing))}")
        unknown = set(self.sources) - set(type(self).model_fields)
        if unknown:
            raise ValueError(f"sources: names unknown fields {', '.join(sorted(unknown))}")
        return self


class GpuSpec(_Sourced):
    name: str
    peak_bf16_tflops: Tflops  # dense, no sparsity
    hbm_gib: CapacityGiB
    hbm_GBps: BandwidthGBps
    # Fraction of hbm_GBps that memory-bound kernels (norms, activations, optimizer, casts) reach.
    hbm_efficiency: Efficiency
    # Memory the framework cannot use for the model: CUDA context, NCCL/cuBLAS workspaces, fragmentation.
    reserved_gib: ReserveGiB
    # Achieved fraction of peak for a bf16 GEMM as a function of its size in GFLOP (log-interpolated).
    gemm_efficiency: Curve
    # Achieved fraction of peak for flash attention forward; backward costs attention_bwd_factor x forward.
    attention_efficiency: Efficiency
    attention_bwd_factor: CostRatio
    # Fixed per-layer cost of kernel launches and framework hooks in the forward pass (backward: 2x).
    layer_overhead_us: Microseconds
    # HBM traffic of the memory-bound kernels relative to a fused count (norms, rotary, activation,
    # residuals): eager PyTorch moves several times the minimum.
    elementwise_traffic_factor: CostRatio = 1.0
    # A layer's forward never takes less than this (host-side kernel launch rate); backward: 2x.
    layer_min_fwd_us: Microseconds = 0.0
    # Whether the tensor cores run bf16 (Ampere and later); without it (Volta: V100) peak_bf16_tflops holds the
    # fp16 rate and only fp16 training is accepted.
    bf16: bool = True

    @model_validator(mode="after")
    def _curves(self) -> GpuSpec:
        _check_curve("gemm_efficiency", self.gemm_efficiency, y_max=1.0)
        _check_range("gemm_efficiency", curve_problem(self.gemm_efficiency, y_range=(MIN_FRACTION, 1.0)))
        return self


class CpuSpec(_Sourced):
    name: str
    cores: Count
    mem_gib: CapacityGiB
    mem_GBps: BandwidthGBps
    # Whole-step Adam latency by implementation: (billions of params, seconds) using adam_ref_cores cores.
    adam_s_by_gparams: dict[AdamImpl, Curve]
    adam_ref_cores: Count
    # Cores past which Adam is memory-bandwidth bound and stops speeding up.
    adam_saturation_cores: Count
    # fp32<->bf16 conversion throughput on all cores, in GB/s of fp32 data.
    cast_GBps: BandwidthGBps
    # Host memory the training process cannot use (OS, page cache, framework).
    reserved_gib: ReserveGiB
    # The host thread's speed at DeepSpeed's Python paths (ZeRO-3 hooks, step() bookkeeping, worker queue)
    # relative to the x86 VM those costs were measured on (sosim.costs.grace_host); 1.0: that VM's core.
    host_thread_speed: CostRatio = 1.0
    # Base page size of the host kernel: first-touch of a fresh buffer faults once per page (sosim.costs.grace_host).
    page_kib: PageKiB = 4.0

    @model_validator(mode="after")
    def _curves(self) -> CpuSpec:
        if not self.adam_s_by_gparams:
            raise ValueError("adam_s_by_gparams needs at least one implementation")
        for impl, curve in self.adam_s_by_gparams.items():
            _check_curve(f"adam_s_by_gparams.{impl}", curve)
            _check_range(f"adam_s_by_gparams.{impl}", curve_problem(
                curve, y_per_x=(MIN_ADAM_S_PER_GPARAM, MAX_ADAM_S_PER_GPARAM)))
        return self


class LinkSpec(_Sourced):
    kind: Literal["pcie", "c2c"]
    h2d_GBps: BandwidthGBps
    d2h_GBps: BandwidthGBps
    # Total of both directions when both are busy; below h2d+d2h means the directions slow each other.
    bidir_GBps: BandwidthGBps
    # Pageable (unpinned) copies reach this fraction of the pinned bandwidth.
    pageable_factor: Efficiency
    latency_us: Microseconds


class InterconnectSpec(_Sourced):
    """GPU-GPU fabric for data/sequence parallel collectives."""

    gpu_gpu_GBps: BandwidthGBps
    node_node_GBps: BandwidthGBps
    gpus_per_node: GpuCount
    latency_us: Microseconds


# --- The node and the cluster (docs/model.md "Machine model") ------------------------------------------------
# A profile's ``gpu``, ``cpu`` and ``link`` describe one GPU, one CPU socket and one GPU's own host link. The
# optional ``node`` block says how many of each a node has and what they share; ``network`` joins nodes.
# Without ``node`` a profile is the legacy single-GPU description: every GPU of a run gets its own copy of
# ``cpu`` and ``link`` (what sosim did before nodes existed), with ``interconnect`` for collectives.

CollectiveName = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]
NonNegInt = Annotated[int, Field(ge=0)]


def _check_busbw(name: str, curves: dict[CollectiveName, Curve]) -> None:
    for kind, curve in curves.items():
        _check_curve(f"{name}.{kind}", curve)
        _check_range(f"{name}.{kind}", curve_problem(curve, y_range=(MIN_GBPS, MAX_GBPS)))


class UplinkSpec(_Sourced):
    """A PCIe switch uplink or root port that the host copies of several GPUs share (x86 servers)."""

    gpus: list[NonNegInt]  # node-local GPU indices behind this uplink
    h2d_GBps: BandwidthGBps
    d2h_GBps: BandwidthGBps
    # Total of both directions when both are busy.
    bidir_GBps: BandwidthGBps

    @model_validator(mode="after")
    def _gpus(self) -> UplinkSpec:
        if len(self.gpus) < 2 or len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"gpus: an uplink is shared by two or more distinct GPUs, got {self.gpus}")
        return self


class SocketLinkSpec(_Sourced):
    """Between the node's CPU sockets (UPI, Infinity Fabric, Grace-Grace): a rank reaching the memory of a
    socket other than its own (CPU Adam on a neighbour Grace, a GPU attached to the other socket)."""

    GBps: BandwidthGBps  # per direction
    latency_us: Microseconds = 0.0


class FabricSpec(_Sourced):
    """GPU-GPU links inside the node."""

    kind: Literal["nvlink", "nvswitch", "pcie", "none"]
    # Per GPU and direction into the fabric (NVLink: the links to one peer for a point-to-point mesh).
    GBps: BandwidthGBps
    latency_us: Microseconds
    # Measured NCCL bus bandwidth (nccl-tests' busbw) of the node's GPUs by message size: (MiB, GB/s) per
    # collective. Measured beats analytic: collectives inside the node read these when present.
    nccl_busbw_GBps_by_mib: dict[CollectiveName, Curve] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _curves(self) -> FabricSpec:
        _check_busbw("nccl_busbw_GBps_by_mib", self.nccl_busbw_GBps_by_mib)
        return self


class NicSpec(_Sourced):
    """The node's network interfaces."""

    count: Count
    GBps: BandwidthGBps  # per NIC and direction
    # NIC index of each GPU (len = node.gpus); None: GPUs spread evenly, GPU i on NIC i * count // gpus.
    gpu_nic: list[NonNegInt] | None = None


class NetworkSpec(_Sourced):
    """Between nodes: latency and, when measured, NCCL bus bandwidth over several nodes by message size."""

    latency_us: Microseconds
    nccl_busbw_GBps_by_mib: dict[CollectiveName, Curve] = Field(default_factory=dict)
    # Nodes in that measurement (its busbw is turned into an efficiency of the analytic model at that size).
    nccl_nodes: Annotated[int, Field(ge=2, le=MAX_GPUS)] = 2

    @model_validator(mode="after")
    def _curves(self) -> NetworkSpec:
        _check_busbw("nccl_busbw_GBps_by_mib", self.nccl_busbw_GBps_by_mib)
        return self


class NvmeSpec(_Sourced):
    """The node's NVMe tier (one RAID-0 volume shared by the node's ranks, as ZeRO-Infinity uses it)."""

    drives: Count
    # Aggregate of the volume for large (~1 GB) direct-I/O transfers to/from pinned CPU buffers.
    read_GBps: BandwidthGBps
    write_GBps: BandwidthGBps
    capacity_gib: CapacityGiB
    latency_us: Microseconds
    # GPUDirect Storage: NVMe <-> HBM without the host bounce buffer.
    gds: bool = False


class NodeSpec(_Sourced):
    gpus: GpuCount
    cpu_sockets: Count = 1  # each socket is one ``cpu`` section: its cores, memory and bandwidth
    # Socket (NUMA node) each GPU's host link attaches to; None: spread evenly, GPU i on i * sockets // gpus.
    gpu_socket: list[NonNegInt] | None = None
    # STREAM bandwidth of one socket's memory: the pool CPU Adam, casts and every DMA to/from that socket
    # share. None: host memory bandwidth is not contended (legacy profiles).
    dram_GBps: BandwidthGBps | None = None
    uplinks: list[UplinkSpec] = Field(default_factory=list)
    socket_link: SocketLinkSpec | None = None
    fabric: FabricSpec | None = None
    nics: NicSpec | None = None
    nvme: NvmeSpec | None = None

    @model_validator(mode="after")
    def _topology(self) -> NodeSpec:
        if self.gpu_socket is not None:
            if len(self.gpu_socket) != self.gpus:
                raise ValueError(f"gpu_socket: needs one socket per GPU ({self.gpus}), got {len(self.gpu_socket)}")
            if max(self.gpu_socket) >= self.cpu_sockets:
                raise ValueError(f"gpu_socket: socket index out of range (cpu_sockets = {self.cpu_sockets})")
        seen: set[int] = set()
        for i, up in enumerate(self.uplinks):
            if max(up.gpus) >= self.gpus:
                raise ValueError(f"uplinks.{i}.gpus: GPU index out of range (node has {self.gpus})")
            if seen & set(up.gpus):
                raise ValueError(f"uplinks.{i}.gpus: a GPU sits behind one uplink only")
            seen |= set(up.gpus)
        nics = self.nics
        if nics is not None and nics.gpu_nic is not None and (
            len(nics.gpu_nic) != self.gpus or max(nics.gpu_nic) >= nics.count
        ):
            raise ValueError(f"nics.gpu_nic: needs one NIC index (< {nics.count}) per GPU ({self.gpus})")
        if self.cpu_sockets > 1 and self.socket_link is None:
            raise ValueError("socket_link: a node with several CPU sockets needs the link between them")
        return self


class LeaseSpread(_Sourced):
    """How much a component's median moves between leases (machines) of this kind: the log-sd of the median
    between measuring sessions, for host-side work (CPU Adam, casts, pageable copies, refresh, hooks) and for
    device-side work (kernels, pinned DMA). Measured when the profile's tables repeat a section on another lease
    (:attr:`sosim.costs.calibration_table.CalibrationTable.session_log_sd`, which wins); else stated here, with its
    source, for the error bands."""

    host_log_sd: float = Field(default=0.0, ge=0.0, le=1.0)
    device_log_sd: float = Field(default=0.0, ge=0.0, le=1.0)

    def as_mapping(self) -> dict[str, float]:
        return {"host": self.host_log_sd, "device": self.device_log_sd}


class HardwareProfile(_Strict):
    name: str
    description: str = ""
    gpu: GpuSpec
    cpu: CpuSpec
    link: LinkSpec
    interconnect: InterconnectSpec | None = None
    node: NodeSpec | None = None
    network: NetworkSpec | None = None
    # Optional measured table(s) (see docs/calibration.md); resolved to absolute paths by the loader. A list:
    # later tables add the (op, variant) measurements the earlier ones lack and replace those they re-measure.
    calibration: str | list[str] | None = None
    # The lease-to-lease spread for the error bands when the tables do not repeat a section themselves.
    lease_spread: LeaseSpread | None = None
    # The profile file that names the calibration table, as loaded from disk, and its path: what-if rescaling
    # starts from its numbers (sosim/costs/table.py). Found in the profile folders by the loader
    # (sosim.run.loader.find_baseline) when it loads a scenario, never while simulating; None: not looked up.
    _calibration_baseline: tuple[HardwareProfile | None, str] | None = PrivateAttr(default=None)

    @property
    def calibration_baseline(self) -> tuple[HardwareProfile | None, str]:
        """(baseline profile, its file) as the loader found them; (None, "") when none was found or looked up
        (the profile's own numbers are then the baseline)."""
        return self._calibration_baseline if self._calibration_baseline is not None else (None, "")

    @property
    def calibration_paths(self) -> list[str]:
        """The calibration tables in order (empty without any)."""
        if self.calibration is None:
            return []
        return [self.calibration] if isinstance(self.calibration, str) else list(self.calibration)

    @property
    def gpus_per_node(self) -> int:
        if self.node is not None:
            return self.node.gpus
        return self.interconnect.gpus_per_node if self.interconnect is not None else 1

    @property
    def has_collectives(self) -> bool:
        """Whether collectives between GPUs can be timed (a fabric, NICs, or the legacy interconnect)."""
        if self.interconnect is not None:
            return True
        return self.node is not None and (self.node.fabric is not None or self.node.nics is not None)

    @model_validator(mode="after")
    def _reserve_below_capacity(self) -> HardwareProfile:
        # A reserve at or past the capacity leaves no usable memory (reserved_gib=1000 on a 96 GiB GPU gave a
        # usable -910.6 GiB): not a machine.
        for section, reserve, capacity in (("gpu", self.gpu.reserved_gib, self.gpu.hbm_gib),
                                           ("cpu", self.cpu.reserved_gib, self.cpu.mem_gib)):
            if reserve >= capacity:
                what = "hbm_gib" if section == "gpu" else "mem_gib"
                raise FieldProblem(f"{section}.reserved_gib", f"{reserve:g} GiB reserved is not below the "
                                   f"{capacity:g} GiB of {section}.{what}: nothing would be left to train with")
        return self


class ModelSpec(_Strict):
    name: str = ""
    layers: PosInt
    hidden: PosInt
    heads: PosInt
    kv_heads: PosInt | None = None  # None: equal to heads (multi-head attention)
    ffn: PosInt | None = None  # None: 4*hidden for gelu, Llama's 8/3*hidden rounded to 256 for swiglu
    ffn_kind: Literal["gelu", "swiglu"] = "gelu"
    vocab: PosInt = 50432
    tied_embeddings: bool = False
    # Width of one attention head; None: hidden / heads. Qwen3, Gemma and GPT-OSS set it on its own, so the
    # attention width heads x head_dim differs from hidden (q and o projections are hidden x heads*head_dim).
    head_dim: PosInt | None = None
    # RMSNorm scales on q and k per head (Qwen3's q_norm / k_norm): two more tensors of head_dim per layer.
    qk_norm: bool = False
    # --- mixture of experts (sosim/hardware/moe.py); all unset: a dense model ---------------------------------
    experts: PosInt | None = None  # routed experts per MoE layer (num_experts / num_local_experts / n_routed_experts)
    experts_per_token: PosInt | None = None  # top-k (num_experts_per_tok)
    shared_experts: NonNegInt = 0  # experts every token runs (n_shared_experts; Qwen2-MoE's shared expert)
    expert_ffn: PosInt | None = None  # one expert's SwiGLU width (moe_intermediate_size); None: ffn
    shared_expert_ffn: PosInt | None = None  # one shared expert's width; None: expert_ffn
    dense_layers: NonNegInt = 0  # layers with the dense ffn instead (first_k_dense_replace, mlp_only_layers)
    # How tokens spread over the experts: 0 = uniform (tokens x top-k / experts each); s > 0: expert e gets a
    # share proportional to (e+1)^-s (Zipf), capped at every token; a what-if knob, not read from configs.
    routing_skew: NonNegFloat = 0.0
    # How the framework runs the experts (Hugging Face transformers 5.x ``experts_implementation``):
    # "grouped_mm" (its default: one grouped GEMM per projection) or "eager" (a Python loop over hit experts).
    experts_impl: Literal["grouped_mm", "eager"] = "grouped_mm"
    # How the experts' weights are held: "fused", two 3-D tensors per layer (transformers 5.x Qwen3MoeExperts);
    # "per_expert", one module of three Linears per expert (transformers 4.x, most hand-written MoE layers): ZeRO-3
    # hooks and fetches per expert module then.
    expert_tensors: Literal["fused", "per_expert"] = "fused"
    # The MoE block is a ZeRO-3 leaf module: DeepSpeed installs no hooks below it and fetches all its tensors at
    # once (deepspeed/runtime/zero/leaf_module_config.py DEFAULT_LEAF_MODULE_CLASSES in 0.18 and 0.19: the
    # Qwen3-MoE, Qwen2-MoE and Mixtral sparse blocks). Other MoE blocks are hooked module by module.
    zero3_leaf_block: bool = False
    # --- attention variants -----------------------------------------------------------------------------------
    sliding_window: PosInt | None = None  # tokens a sliding-window layer attends to
    sliding_layers: NonNegInt = 0  # how many layers use the window (layer_types "sliding_attention")
    attention_sinks: bool = False  # GPT-OSS: one learned sink logit per head and layer

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden})")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if (self.experts is None) != (self.experts_per_token is None):
            raise ValueError("experts and experts_per_token go together (a mixture of experts needs both)")
        if self.experts is None and (self.shared_experts or self.expert_ffn or self.dense_layers
                                     or self.shared_expert_ffn):
            raise ValueError("shared_experts, expert_ffn, shared_expert_ffn and dense_layers describe a mixture "
                             "of experts: set experts and experts_per_token too")
        if self.experts is not None and self.experts_per_token is not None:
            if self.experts_per_token > self.experts:
                raise ValueError(f"experts_per_token ({self.experts_per_token}) cannot exceed experts "
                                 f"({self.experts})")
            if self.ffn_kind != "swiglu":
                raise ValueError("mixture-of-experts layers are modelled with SwiGLU experts (ffn_kind: swiglu)")
            if self.dense_layers >= self.layers:
                raise ValueError(f"dense_layers ({self.dense_layers}) must leave at least one MoE layer of "
                                 f"{self.layers}")
        if self.sliding_layers > self.layers:
            raise ValueError(f"sliding_layers ({self.sliding_layers}) cannot exceed layers ({self.layers})")
        if self.sliding_layers and self.sliding_window is None:
            raise ValueError("sliding_layers needs sliding_window (the tokens those layers attend to)")
        return self

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Attention width: heads x head_dim (= hidden unless head_dim says otherwise)."""
        return self.heads * self.attn_head_dim if self.head_dim is not None else self.hidden

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.attn_head_dim

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def ffn_dim(self) -> int:
        if self.ffn is not None:
            return self.ffn
        if self.ffn_kind == "gelu":
            return 4 * self.hidden
        return 256 * ((8 * self.hidden // 3 + 255) // 256)

    @property
    def expert_ffn_dim(self) -> int:
        return self.expert_ffn if self.expert_ffn is not None else self.ffn_dim

    @property
    def shared_expert_ffn_dim(self) -> int:
        return self.shared_expert_ffn if self.shared_expert_ffn is not None else self.expert_ffn_dim


class TrainingSpec(_Strict):
    seq_len: PosInt
    micro_batch: PosInt
    grad_accum: PosInt = 1
    activation_checkpointing: bool = True
    precision: Literal["bf16", "fp16"] = "bf16"
    gradient_clipping: NonNegFloat = 1.0  # 0 disables clipping (and so the global-norm dependency)
    # Fraction of steps whose gradient norm exceeds the clip threshold (drives STV rollbacks).
    clip_rate: UnitInterval = 0.0
    # Tokens whose logits are materialised at once (tiled/chunked loss, as long-sequence training does);
    # None = the whole micro-batch at once.
    loss_chunk_tokens: PosInt | None = None
    # Which framework code runs the layers where it changes their work (sosim/costs/training_stack.py): "eager" = the
    # timed eager layers; "hf_fa2_padded" = Hugging Face FlashAttention-2 on padded batches, whose attention
    # runs over ``real_tokens_per_sample`` real tokens only (required then).
    stack: Literal["eager", "hf_fa2_padded"] = "eager"
    real_tokens_per_sample: PosInt | None = None
    # Simulated iterations; the steady-state step is measured between the last two.
    iterations: Annotated[int, Field(ge=3, le=50)] = 3

    @model_validator(mode="after")
    def _stack_tokens(self) -> TrainingSpec:
        if self.stack == "hf_fa2_padded" and self.real_tokens_per_sample is None:
            raise ValueError("stack: hf_fa2_padded needs real_tokens_per_sample (the unpadded tokens per sample "
                             "FlashAttention-2's varlen path attends over)")
        if self.real_tokens_per_sample is not None and self.real_tokens_per_sample > self.seq_len:
            raise ValueError("real_tokens_per_sample cannot exceed seq_len (samples are padded to seq_len)")
        return self


Implementation = Literal["ideal", "deepspeed"]


# The validation-context key under which the loader hands ``schedule:`` its validator (the system registry's
# ``validate_knobs``): knob validation belongs to loading, and this module knows no system.
KNOBS_CONTEXT = "validate_knobs"


def _validate_schedule(value: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> object:
    """Validate ``schedule:`` as the knobs model of the system it names, with the validator the loader passes
    in the validation context (:data:`KNOBS_CONTEXT`; sosim/schedules/registry.py). Without one, only a
    system's knobs instance is accepted (a scenario derived from a loaded one keeps its knobs)."""
    del handler
    context = info.context
    validate = context.get(KNOBS_CONTEXT) if isinstance(context, Mapping) else None
    if validate is not None:
        return validate(value)
    if isinstance(value, ScheduleKnobs) and type(value) is not ScheduleKnobs:
        return value
    raise ValueError("a system's knobs are validated where a scenario is loaded: use sosim.run.loader.load_scenario "
                     "or sosim.run.loader.scenario_from_data")


class ScheduleKnobs(_Strict):
    """Base of every system's knobs (each system module defines its subclass with a ``system`` literal)."""

    system: str
    # Which DeepSpeed release runs the system (sosim/inputs/ds_versions.py lists the modelled ones; what each
    # does differently: sosim/schedules/blocks/ds_version.py). Ignored by the paper's schedules (implementation: ideal).
    deepspeed_version: DeepSpeedVersion = Field(NEWEST, description=
        "The DeepSpeed release that runs the system (sosim/inputs/ds_versions.py lists the modelled ones; what each "
        "does differently: sosim/schedules/blocks/ds_version.py). Ignored by the paper's schedules (implementation: "
        "ideal) and by the systems that are not DeepSpeed")


class OffloadKnobs(ScheduleKnobs):
    """Knobs shared by every system that runs the optimizer on the CPU; defaults follow ``implementation``.

    A subclass lists its typed per-implementation defaults in ``DEFAULTS`` (implementation -> a pydantic
    model holding the defaults); a knob the scenario does not set takes the default of the scenario's
    implementation, whether the knobs are built from YAML, through ``Scenario`` or directly (one source).
    """

    implementation: Implementation = Field("deepspeed", description=
        "deepspeed: what DeepSpeed runs; ideal: the paper's schedule. The knobs' defaults follow it")
    cpu_adam: AdamImpl = Field("cpu_adam", description=
        "The CPU Adam kernel; it must have a curve in the profile. A DeepSpeed preset runs cpu_adam as its release "
        "builds it: on a profile with a cpu_adam_sve curve (Grace) 0.19.8 runs the SVE kernel (PR 8365)")
    pin_memory: bool = Field(True, description=
        "Pinned host buffers (DeepSpeed offload_optimizer.pin_memory); false: pageable_factor of the bandwidth")
    DEFAULTS: ClassVar[Mapping[str, BaseModel]] = {}

    @model_validator(mode="before")
    @classmethod
    def _implementation_defaults(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        impl = data.get("implementation", cls.model_fields["implementation"].default)
        defaults = cls.DEFAULTS.get(str(impl))
        if defaults is None:
            return data
        return {**defaults.model_dump(), **data}


class ClusterSpec(_Strict):
    gpus: GpuCount = 1
    data_parallel: GpuCount | None = None  # None: all GPUs data parallel
    sequence_parallel: GpuCount = 1
    # GPUs used on each node; None: every GPU of the profile's node (a 2-GPU run on a 4-GPU node fills one
    # node). 1 with gpus: 2 = two hosts of one GPU each.
    gpus_per_node: GpuCount | None = None
    # How DeepSpeed's launcher starts the ranks of a node. Its default (False) binds nothing and leaves
    # OMP_NUM_THREADS unset: every rank's OpenMP pool has torch's default, all of the node's cores, and the
    # ranks time-share them (measured on the lent 2-GPU machine: calibration/nvidia-h200x2-2026-11-30/
    # affinities.json, 32 threads per rank on 32 cores). True: `--bind_cores_to_rank`, the node's cores
    # divided among its ranks (deepspeed/launcher/launch.py, deepspeed/utils/numa.py get_numactl_cmd).
    bind_cores_to_rank: bool = False
    # CPU threads of each rank, when the run sets them itself (OMP_NUM_THREADS / torch.set_num_threads);
    # None: as the launcher leaves them (bind_cores_to_rank above).
    cpu_threads_per_rank: PosInt | None = None
    # Where each rank's optimizer state (host master weights, Adam moments) lives and its CPU Adam runs:
    # "own" (its GPU's socket), "neighbour" (another socket's DRAM and cores: first the sockets no local rank's
    # GPU sits on, in turn, else the next socket), or one socket per local rank. SuperOffload's artifact
    # launch scripts bind the CPU Adam worker to another Grace's cores (72-143) with --bind_cores_to_rank.
    optimizer_socket: Literal["own", "neighbour"] | list[NonNegInt] = "own"

    @model_validator(mode="after")
    def _product(self) -> ClusterSpec:
        if self.dp * self.sequence_parallel != self.gpus:
            raise ValueError(
                f"data_parallel ({self.dp}) x sequence_parallel ({self.sequence_parallel}) "
                f"must equal gpus ({self.gpus})"
            )
        return self

    @property
    def dp(self) -> int:
        return self.data_parallel if self.data_parallel is not None else self.gpus // self.sequence_parallel


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    hardware: HardwareProfile
    model: ModelSpec
    training: TrainingSpec
    # Validated as the knobs model of the named system; serialised with its own fields.
    schedule: Annotated[SerializeAsAny[ScheduleKnobs], WrapValidator(_validate_schedule)]
    cluster: ClusterSpec = ClusterSpec()

    @model_validator(mode="after")
    def _precision_supported(self) -> Scenario:
        gpu = self.hardware.gpu
        if self.training.precision == "bf16" and not gpu.bf16:
            raise FieldProblem("training.precision", f"bf16, but the {gpu.name} of profile '{self.hardware.name}' "
                                                     "has no bf16 (its peak is the fp16 rate): use fp16")
        return self

    @model_validator(mode="after")
    def _combinations(self) -> Scenario:
        sched = self.schedule
        if isinstance(sched, OffloadKnobs) and sched.cpu_adam not in self.hardware.cpu.adam_s_by_gparams:
            known = ", ".join(sorted(self.hardware.cpu.adam_s_by_gparams))
            raise ValueError(
                f"schedule.cpu_adam: '{sched.cpu_adam}' has no timing in profile '{self.hardware.name}' "
                f"(cpu.adam_s_by_gparams has: {known})"
            )
        check = getattr(sched, "check_scenario", None)
        problem = check(self) if callable(check) else None
        if problem:
            raise ValueError(problem)
        node = self.hardware.node
        if getattr(type(sched), "NEEDS_NVME", False) and (node is None or node.nvme is None):
            raise ValueError(
                f"schedule.system: '{sched.system}' keeps state on NVMe, but profile '{self.hardware.name}' has no "
                f"'node.nvme' volume"
            )
        if self.cluster.gpus > 1 and not self.hardware.has_collectives:
            raise ValueError(
                f"cluster.gpus: {self.cluster.gpus} GPUs need a 'node' section with a fabric or NICs (or the "
                f"legacy 'interconnect' section) in profile '{self.hardware.name}'"
            )
        per_node = self.cluster.gpus_per_node
        if per_node is not None and per_node > self.hardware.gpus_per_node:
            raise ValueError(
                f"cluster.gpus_per_node: {per_node} is more than the {self.hardware.gpus_per_node} GPUs of a "
                f"'{self.hardware.name}' node"
            )
        used = per_node or min(self.cluster.gpus, self.hardware.gpus_per_node)
        if self.cluster.gpus % used:
            raise ValueError(f"cluster.gpus: {self.cluster.gpus} GPUs do not fill nodes of {used} evenly")
        node = self.hardware.node
        if self.cluster.gpus > used and node is not None and node.nics is None:
            raise ValueError(
                f"cluster.gpus: {self.cluster.gpus} GPUs span {self.cluster.gpus // used} nodes of "
                f"'{self.hardware.name}', whose profile has no 'node.nics' to join them"
            )
        placement = self.cluster.optimizer_socket
        if placement != "own":
            sockets = node.cpu_sockets if node is not None else 1
            if node is None or sockets < 2:
                raise ValueError(
                    f"cluster.optimizer_socket: {placement!r} needs a node of several CPU sockets, but profile "
                    f"'{self.hardware.name}' has {'no node section' if node is None else 'one socket'}"
                )
            if isinstance(placement, list) and (len(placement) != used or max(placement) >= sockets):
                raise ValueError(
                    f"cluster.optimizer_socket: {placement} must give one socket (0-{sockets - 1}) to each of the "
                    f"{used} ranks of a node"
                )
        if self.cluster.sequence_parallel > 1 and self.model.heads % self.cluster.sequence_parallel:
            raise ValueError("cluster.sequence_parallel must divide model.heads (Ulysses splits heads)")
        return self
