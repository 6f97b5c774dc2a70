"""The planners' front door: one environment's GPU memory plan, capacity plan and fleet plans.

They are computed once, when the settings load (:mod:`stacks.settings.loading`), and handed to
the stacks beside the settings, so no stack plans again and no validator runs a planner. A
planner that refuses a section which validated raises :class:`PlanRefused`, whose message is the
one a bad value of that section gets (``llm: the GPU memory budget refuses this configuration:
...``).
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity_model import (
    CapacityError,
    DecodeTableError,
    DemandError,
    FleetError,
    FleetPlan,
    LlmCapacity,
)
from gpu_budget import BudgetError, MemoryPlan
from stacks.settings.environment import EnvironmentSettings
from stacks.settings.intent import IntentEndpointSettings
from stacks.settings.llm import LlmEndpointSettings

CAPACITY_ERRORS = (CapacityError, DecodeTableError, DemandError, FleetError)
"""What the capacity model raises for settings it cannot plan."""


class PlanRefused(ValueError):
    """A planner refuses the settings of one section (``llm`` or ``intent``)."""

    def __init__(self, section: str, message: str) -> None:
        super().__init__(message)
        self.section = section


class PlansRefused(ValueError):
    """One or more sections' planners refuse the settings, in the settings' field order."""

    def __init__(self, refusals: list[PlanRefused]) -> None:
        super().__init__("\n".join(f"{r.section}: {r}" for r in refusals))
        self.refusals = refusals


@dataclass(frozen=True)
class LlmPlans:
    """The LLM endpoint's GPU memory plan and the capacity plan made from it."""

    memory: MemoryPlan
    capacity: LlmCapacity


@dataclass(frozen=True)
class EnvironmentPlans:
    """Every plan of one environment: what the stacks size the endpoints and their scaling by."""

    llm_memory: MemoryPlan
    llm_capacity: LlmCapacity
    intent_fleet: FleetPlan

    @property
    def llm_fleet(self) -> FleetPlan:
        """The LLM's fleet numbers (part of its capacity plan)."""
        return self.llm_capacity.fleet


def plan_llm(llm: LlmEndpointSettings) -> LlmPlans:
    """The GPU budget's plan, then the capacity model's; PlanRefused names what refused."""
    try:
        memory = llm.memory_plan()
    except BudgetError as exc:
        raise PlanRefused("llm", "the GPU memory budget refuses this configuration: "
                                 f"{exc}") from None
    try:
        capacity = llm.capacity_plan(memory)
    except CAPACITY_ERRORS as exc:
        raise PlanRefused("llm", f"the capacity model refuses this configuration: {exc}") from None
    return LlmPlans(memory, capacity)


def plan_intent(intent: IntentEndpointSettings) -> FleetPlan:
    """The classifier's fleet plan from its declared rate; PlanRefused when it cannot be made,
    then when SageMaker would not honour the section's deployment (the intent section's last
    rule, checked after its planner as it always was:
    :meth:`IntentEndpointSettings.deployment_problem`)."""
    try:
        fleet = intent.fleet_plan()
    except FleetError as exc:
        raise PlanRefused("intent", "the capacity model refuses this configuration: "
                                    f"{exc}") from None
    problem = intent.deployment_problem()
    if problem:
        raise PlanRefused("intent", problem)
    return fleet


PLANNED_SECTIONS: dict[str, type[LlmEndpointSettings] | type[IntentEndpointSettings]] = {
    "llm": LlmEndpointSettings,
    "intent": IntentEndpointSettings,
}
"""The sections of :class:`EnvironmentSettings` a planner reads, in field order."""


def refusal_of(section: str, settings: LlmEndpointSettings | IntentEndpointSettings
               ) -> PlanRefused | None:
    """Why ``section``'s planner refuses its (validated) settings, or None."""
    try:
        if isinstance(settings, LlmEndpointSettings):
            plan_llm(settings)
        else:
            plan_intent(settings)
    except PlanRefused as refused:
        return refused
    return None


def plan_environment(settings: EnvironmentSettings) -> EnvironmentPlans:
    """Every plan of ``settings``; :class:`PlansRefused` lists each section that cannot be
    planned."""
    refusals: list[PlanRefused] = []
    llm: LlmPlans | None = None
    intent: FleetPlan | None = None
    try:
        llm = plan_llm(settings.llm)
    except PlanRefused as refused:
        refusals.append(refused)
    try:
        intent = plan_intent(settings.intent)
    except PlanRefused as refused:
        refusals.append(refused)
    if llm is None or intent is None:
        raise PlansRefused(refusals)
    return EnvironmentPlans(llm_memory=llm.memory, llm_capacity=llm.capacity,
                            intent_fleet=intent)
