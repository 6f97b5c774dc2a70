"""SageMaker instance types as data, and the per-SKU ``gpu_memory_utilization`` rule.

Memory per accelerator is what ``nvidia-smi --query-gpu=memory.total`` reports for the GPU (MiB):
T4 15,360; A10G 23,028; L4 23,034; L40S 46,068; A100-SXM4-40GB 40,960; A100-SXM4-80GB 81,920;
H100 80GB HBM3 81,559 (the last read on this project's device machine, 2026-11-13; the others
from public ``nvidia-smi`` output of those cards). vLLM multiplies ``gpu_memory_utilization`` by
the total that CUDA reports (``torch.cuda.mem_get_info()[1]``), which is up to ~0.5 GiB below
nvidia-smi's figure (79.18 GiB vs 79.65 GiB on an H100); the headroom rule below absorbs that.
Inferentia: 8 GiB of DRAM per Inferentia chip (4 NeuronCores v1), 32 GiB of HBM per
Inferentia2 chip (2 NeuronCores v2).

Prices — approximate, for cost estimates only. ``reference_usd_per_hour_us_east_1`` is the
SageMaker real-time inference on-demand price in us-east-1 as it appears in public copies of
AWS's price list (2025); rows marked ``price_basis="derived"`` had no such copy and are the EC2
on-demand price × 1.4, SageMaker's usual markup on GPU instances. The default region is Tokyo
(ap-northeast-1): ``on_demand_usd_per_hour`` = us-east-1 price × ``TOKYO_PRICE_FACTOR`` (1.35,
the ratio of Tokyo to N. Virginia EC2 on-demand GPU prices). Refresh from the AWS Price List API
(service code AmazonSageMaker, component "Hosting", regionCode ap-northeast-1) before quoting a
number to anyone who pays the bill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3
MIB = 1024**2

PRICE_REGION = "ap-northeast-1"
PRICES_COMPILED_ON = "2026-11-22"
"""When the table below was compiled (from 2025 public copies of the us-east-1 price list)."""
TOKYO_PRICE_FACTOR = 1.35
HOURS_PER_MONTH = 730
"""AWS's own convention for monthly cost (8,760 hours / 12)."""

# ---------------------------------------------------------------------------------------------
# The per-SKU gpu_memory_utilization rule.
#
# KAITO (kaito-project/kaito) derived it from the SKU's memory: pkg/model/interface.go
# `getGPUMemoryUtilForVLLM` returned floor((1 - 1.5 GiB / per-GPU memory) × 100) / 100, capped at
# `UpperMemoryUtilVLLM = 0.95` (0.9 when the SKU is unknown) — so smaller GPUs get a smaller
# fraction. Issue kaito-project/kaito#1374 found the fixed 1.5 GiB too small: CUDA/driver memory
# on a 24 GB A10 was ~2.4 GiB, so 0.93 failed vLLM's start-up check ("Free memory on device
# (21.37/23.72 GiB) on startup is less than desired GPU memory utilization (0.95, 22.54 GiB)").
# KAITO then measured free memory at start-up, kept 600 MiB back "for pytorch memory fragments"
# (presets/workspace/inference/vllm/inference_api.py), still capped at 0.95, and today its
# operator passes 0.84 (the in-pod fallback is 0.84 too). We keep KAITO's shape — reserve a
# fixed amount outside vLLM's budget, floor to two decimals, cap at 0.95 — with the reserve made
# of what the issue and vLLM's start-up measured on 24 GB cards:
#   2.4 GiB  CUDA context and driver allocations before vLLM starts (kaito#1374, A10)
#   0.6 GiB  PyTorch allocator fragmentation (KAITO inference_api.py)
#   0.5 GiB  CUDA-graph capture and sampler warm-up, which vLLM runs *after* it sized the KV
#            cache, so its profile does not see them (vllm/v1/worker/gpu_worker.py
#            compile_or_warm_up_model; llm-d measured -0.45…+1.03 GiB of graph memory on H100)
# That gives 0.84 on an A10G (23,028 MiB), 0.76 on a T4, 0.92 on an L40S and the 0.95 cap on
# 80 GB cards.
# ---------------------------------------------------------------------------------------------
CUDA_CONTEXT_BYTES = int(2.4 * GIB)
ALLOCATOR_FRAGMENTATION_BYTES = 600 * MIB
CUDA_GRAPH_WARMUP_BYTES = 512 * MIB
OUTSIDE_BUDGET_HEADROOM_BYTES = (
    CUDA_CONTEXT_BYTES + ALLOCATOR_FRAGMENTATION_BYTES + CUDA_GRAPH_WARMUP_BYTES
)
MAX_GPU_MEMORY_UTILIZATION = 0.95
"""KAITO's cap (UpperMemoryUtilVLLM); also the highest value :func:`plan` accepts."""


def gpu_memory_utilization_for(memory_per_gpu_bytes: int) -> float:
    """The SKU rule: ``floor((1 − headroom / memory) × 100) / 100``, capped at 0.95.

    Monotone in memory, lower for small GPUs (0.76 for a 16 GB T4), ≈0.84 for a 24 GB A10G.
    Raises ``ValueError`` for a GPU too small to leave any budget.
    """
    if memory_per_gpu_bytes <= OUTSIDE_BUDGET_HEADROOM_BYTES:
        raise ValueError(
            f"a GPU of {memory_per_gpu_bytes / GIB:.1f} GiB leaves nothing after the "
            f"{OUTSIDE_BUDGET_HEADROOM_BYTES / GIB:.1f} GiB CUDA/driver/warm-up headroom"
        )
    fraction = math.floor((1 - OUTSIDE_BUDGET_HEADROOM_BYTES / memory_per_gpu_bytes) * 100) / 100
    return min(fraction, MAX_GPU_MEMORY_UTILIZATION)


@dataclass(frozen=True)
class InstanceType:
    """One SageMaker hosting instance type.

    ``memory_per_accelerator_bytes`` is per GPU (nvidia-smi total) or per Inferentia chip.
    ``compute_capability`` is the CUDA capability for GPUs (None for Inferentia);
    ``neuron_cores`` is set for Inferentia. ``on_demand_usd_per_hour`` is the approximate
    ap-northeast-1 price (see module docstring).
    """

    name: str
    accelerator_kind: str
    accelerator_model: str
    accelerator_count: int
    memory_per_accelerator_bytes: int
    compute_capability: tuple[int, int] | None
    neuron_cores: int | None
    reference_usd_per_hour_us_east_1: float
    price_basis: str

    @property
    def family(self) -> str:
        """``ml.g5`` for ``ml.g5.xlarge``."""
        return self.name.rsplit(".", 1)[0]

    @property
    def local_instance_storage(self) -> bool:
        """True when the instance has local NVMe storage (hardware-encrypted).

        SageMaker rejects an endpoint config with a ``KmsKeyId`` for such instances: the volume
        key applies only to EBS-backed types (ml.inf1, ml.inf2 here).
        """
        return self.family in LOCAL_NVME_FAMILIES

    @property
    def gpu_model(self) -> str:
        """Alias of ``accelerator_model`` (the GPU for GPU instances)."""
        return self.accelerator_model

    @property
    def gpu_count(self) -> int:
        """GPUs on the instance (0 for Inferentia)."""
        return self.accelerator_count if self.accelerator_kind == "gpu" else 0

    @property
    def on_demand_usd_per_hour(self) -> float:
        """Approximate Tokyo on-demand price, USD per instance-hour."""
        return round(self.reference_usd_per_hour_us_east_1 * TOKYO_PRICE_FACTOR, 3)

    @property
    def on_demand_usd_per_month(self) -> float:
        """``on_demand_usd_per_hour`` × 730 hours."""
        return round(self.on_demand_usd_per_hour * HOURS_PER_MONTH, 2)

    @property
    def price_region(self) -> str:
        """Region the price applies to."""
        return PRICE_REGION

    @property
    def prices_compiled_on(self) -> str:
        """Date the price table was compiled."""
        return PRICES_COMPILED_ON

    @property
    def default_gpu_memory_utilization(self) -> float:
        """The SKU rule applied to this instance's GPU."""
        return gpu_memory_utilization_for(self.memory_per_accelerator_bytes)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description."""
        return {
            "name": self.name,
            "accelerator_kind": self.accelerator_kind,
            "accelerator_model": self.accelerator_model,
            "accelerator_count": self.accelerator_count,
            "memory_per_accelerator_bytes": self.memory_per_accelerator_bytes,
            "compute_capability": (
                f"{self.compute_capability[0]}.{self.compute_capability[1]}"
                if self.compute_capability
                else None
            ),
            "neuron_cores": self.neuron_cores,
            "local_instance_storage": self.local_instance_storage,
            "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
            "price_region": PRICE_REGION,
            "prices_compiled_on": PRICES_COMPILED_ON,
            "price_basis": self.price_basis,
        }


LOCAL_NVME_FAMILIES: frozenset[str] = frozenset(
    {"ml.g4dn", "ml.g5", "ml.g6", "ml.g6e", "ml.p4d", "ml.p4de", "ml.p5"}
)
"""Families whose instances carry NVMe instance-store volumes (the EC2 instance-type pages)."""

# Accelerators: (kind, model, memory per accelerator in bytes, compute capability).
_T4 = ("gpu", "NVIDIA T4", 15_360 * MIB, (7, 5))
_A10G = ("gpu", "NVIDIA A10G", 23_028 * MIB, (8, 6))
_L4 = ("gpu", "NVIDIA L4", 23_034 * MIB, (8, 9))
_L40S = ("gpu", "NVIDIA L40S", 46_068 * MIB, (8, 9))
_A100_40 = ("gpu", "NVIDIA A100-SXM4-40GB", 40_960 * MIB, (8, 0))
_A100_80 = ("gpu", "NVIDIA A100-SXM4-80GB", 81_920 * MIB, (8, 0))
_H100 = ("gpu", "NVIDIA H100 80GB HBM3", 81_559 * MIB, (9, 0))
_INF1 = ("inferentia", "AWS Inferentia", 8 * GIB, None)
_INF2 = ("inferentia", "AWS Inferentia2", 32 * GIB, None)

# name: (accelerator, accelerator count, NeuronCores, us-east-1 USD/hour, price basis)
_CATALOG_ROWS: dict[str, tuple[tuple[str, str, int, tuple[int, int] | None], int, int | None,
                               float, str]] = {
    "ml.g4dn.xlarge": (_T4, 1, None, 0.7364, "list"),
    "ml.g4dn.2xlarge": (_T4, 1, None, 0.94, "list"),
    "ml.g4dn.4xlarge": (_T4, 1, None, 1.505, "list"),
    "ml.g4dn.8xlarge": (_T4, 1, None, 2.72, "list"),
    "ml.g4dn.12xlarge": (_T4, 4, None, 4.89, "list"),
    "ml.g4dn.16xlarge": (_T4, 1, None, 5.44, "list"),
    "ml.g5.xlarge": (_A10G, 1, None, 1.408, "list"),
    "ml.g5.2xlarge": (_A10G, 1, None, 1.515, "list"),
    "ml.g5.4xlarge": (_A10G, 1, None, 2.03, "list"),
    "ml.g5.8xlarge": (_A10G, 1, None, 3.06, "list"),
    "ml.g5.12xlarge": (_A10G, 4, None, 7.09, "list"),
    "ml.g5.16xlarge": (_A10G, 1, None, 5.12, "list"),
    "ml.g5.24xlarge": (_A10G, 4, None, 10.18, "list"),
    "ml.g5.48xlarge": (_A10G, 8, None, 20.36, "list"),
    "ml.g6.xlarge": (_L4, 1, None, 1.127, "list"),
    "ml.g6.2xlarge": (_L4, 1, None, 1.222, "list"),
    "ml.g6.4xlarge": (_L4, 1, None, 1.654, "list"),
    "ml.g6.8xlarge": (_L4, 1, None, 2.518, "list"),
    "ml.g6.12xlarge": (_L4, 4, None, 5.752, "list"),
    "ml.g6.16xlarge": (_L4, 1, None, 4.246, "list"),
    "ml.g6.24xlarge": (_L4, 4, None, 8.344, "list"),
    "ml.g6.48xlarge": (_L4, 8, None, 16.688, "list"),
    "ml.g6e.xlarge": (_L40S, 1, None, 2.61, "list"),
    "ml.g6e.2xlarge": (_L40S, 1, None, 3.139, "derived"),
    "ml.g6e.4xlarge": (_L40S, 1, None, 4.206, "derived"),
    "ml.g6e.8xlarge": (_L40S, 1, None, 6.341, "derived"),
    "ml.g6e.12xlarge": (_L40S, 4, None, 14.69, "derived"),
    "ml.g6e.16xlarge": (_L40S, 1, None, 10.608, "derived"),
    "ml.g6e.24xlarge": (_L40S, 4, None, 21.092, "derived"),
    "ml.g6e.48xlarge": (_L40S, 8, None, 42.183, "derived"),
    "ml.p4d.24xlarge": (_A100_40, 8, None, 37.688, "list"),
    "ml.p4de.24xlarge": (_A100_80, 8, None, 47.11, "derived"),
    "ml.p5.48xlarge": (_H100, 8, None, 113.068, "list"),
    "ml.inf1.xlarge": (_INF1, 1, 4, 0.297, "derived"),
    "ml.inf1.2xlarge": (_INF1, 1, 4, 0.471, "derived"),
    "ml.inf1.6xlarge": (_INF1, 4, 16, 1.534, "derived"),
    "ml.inf1.24xlarge": (_INF1, 16, 64, 6.137, "derived"),
    "ml.inf2.xlarge": (_INF2, 1, 2, 0.99, "list"),
    "ml.inf2.8xlarge": (_INF2, 1, 2, 2.36, "list"),
    "ml.inf2.24xlarge": (_INF2, 6, 12, 7.79, "list"),
    "ml.inf2.48xlarge": (_INF2, 12, 24, 15.58, "list"),
}

INSTANCE_CATALOG: dict[str, InstanceType] = {
    name: InstanceType(
        name=name,
        accelerator_kind=accel[0],
        accelerator_model=accel[1],
        accelerator_count=count,
        memory_per_accelerator_bytes=accel[2],
        compute_capability=accel[3],
        neuron_cores=cores,
        reference_usd_per_hour_us_east_1=price,
        price_basis=basis,
    )
    for name, (accel, count, cores, price, basis) in _CATALOG_ROWS.items()
}
"""Every instance type the platform may size, by SageMaker name."""


class UnknownInstanceTypeError(KeyError, ValueError):
    """An instance name that is not in :data:`INSTANCE_CATALOG` (a KeyError and a ValueError)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown instance type"


def instance_type(name: str) -> InstanceType:
    """Look up ``name`` (e.g. ``ml.g5.xlarge``); unknown names raise an error listing the known."""
    try:
        return INSTANCE_CATALOG[name]
    except KeyError:
        raise UnknownInstanceTypeError(
            f"instance type {name!r} is not in the catalog; known: "
            + ", ".join(INSTANCE_CATALOG)
        ) from None
