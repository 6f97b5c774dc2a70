"""The capacity model: from one GPU's memory budget to the fleet's scaling numbers and its price.

The GPU budget (:mod:`gpu_budget`) says how much KV cache one engine has; this package says what
that means for traffic. From the budget's plan, the request-length mix (:mod:`request_buckets`'
buckets) and a decode-speed table per GPU and model, it derives per instance the concurrent
requests per bucket (the gateway's admission caps), the requests per minute it sustains within
the latency SLOs, and the headroom to keep; from those and the day's expected traffic, the
fleet's target-tracking targets, step thresholds and daily minima and maxima, and the release
calendar's inputs. The stacks, the scaling simulator and the cost report all read it; none of
them holds a capacity number of its own.

Pure package: no AWS or CDK imports and no settings (``python -m tools.capacity`` reads those).
"""

from capacity_model.conversations import AMPERE_FP8_KV, ConversationOption, conversation_options
from capacity_model.decode_speed import (
    DecodePoint,
    DecodeProfile,
    DecodeSpeedTable,
    DecodeTableError,
    Latency,
    parse_decode_table,
)
from capacity_model.demand import (
    BucketDemand,
    ContextWindow,
    Conversation,
    ConversationRequest,
    DemandError,
    RequestMix,
    request_mix,
    size_conversation,
)
from capacity_model.fleet import (
    DailyProfile,
    FleetError,
    FleetPlan,
    FleetPolicy,
    FloorPlan,
    InstanceLoad,
    StepBand,
    Surge,
    check_bands,
    fleet_plan,
)
from capacity_model.instance import (
    BucketCap,
    CapacityError,
    InstanceCapacity,
    LatencySlo,
    instance_capacity,
)
from capacity_model.plan import LlmCapacity, ReuseInputs, ReuseState, llm_capacity
from capacity_model.rates import SCENARIOS, GpuRates, RateRange, Scenario
from capacity_model.roofline import RooflineInputs, estimate_point, estimate_profile

__all__ = [
    "AMPERE_FP8_KV",
    "SCENARIOS",
    "BucketCap",
    "BucketDemand",
    "CapacityError",
    "ContextWindow",
    "Conversation",
    "ConversationOption",
    "ConversationRequest",
    "DailyProfile",
    "DecodePoint",
    "DecodeProfile",
    "DecodeSpeedTable",
    "DecodeTableError",
    "DemandError",
    "FleetError",
    "FleetPlan",
    "FleetPolicy",
    "FloorPlan",
    "GpuRates",
    "InstanceCapacity",
    "InstanceLoad",
    "Latency",
    "LatencySlo",
    "LlmCapacity",
    "RateRange",
    "RequestMix",
    "ReuseInputs",
    "ReuseState",
    "RooflineInputs",
    "Scenario",
    "StepBand",
    "Surge",
    "check_bands",
    "conversation_options",
    "estimate_point",
    "estimate_profile",
    "fleet_plan",
    "instance_capacity",
    "llm_capacity",
    "parse_decode_table",
    "request_mix",
    "size_conversation",
]
