"""Placement policies, one module each, registered by name in :data:`base.REGISTRY`."""

from services.allocator.policies import first_fit, joint, mc1x1, mpit, random_pick
from services.allocator.policies.base import (
    REGISTRY,
    Policy,
    PolicyOptions,
    Request,
    View,
    create,
)

__all__ = [
    "REGISTRY",
    "Policy",
    "PolicyOptions",
    "Request",
    "View",
    "create",
    "first_fit",
    "joint",
    "mc1x1",
    "mpit",
    "random_pick",
]
