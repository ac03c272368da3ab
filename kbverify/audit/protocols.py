"""Protocols as the audit sees them: which input sets a protocol covers, and the variants null kernels are judged
by. Pure, shared by the parent and the audit's child side (`kbverify.worker.audit_worker`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kbverify.audit.records import AuditSettings
from kbverify.core.errors import InputError
from kbverify.core.protocols import Protocol, get_protocol


def covers(protocol: Protocol, shape: str, distribution: str, weights: str) -> bool:
    """Whether an input set belongs to the sets `protocol` evaluates a kernel on."""
    return (distribution in protocol.distributions
            and (weights == "default" or protocol.rerandomized_weights)
            and (shape == "original" or protocol.hidden_shapes))


def judged_protocols(kernel: str, protocol: Protocol, distributions: Sequence[str]) -> list[Protocol]:
    """The protocols null kernel `kernel` is judged by for `protocol`: the protocol itself, and for the input
    itself also its rule over every audited distribution (the identity test). The worker tracks these only."""
    return [protocol] + ([every_distribution(protocol, distributions)] if kernel == "input" else [])


def every_distribution(protocol: Protocol, distributions: Sequence[str]) -> Protocol:
    """`protocol`'s rule over every audited distribution (named "<p>*"): the identity test for degeneracy."""
    wanted = tuple(dict.fromkeys((*protocol.distributions, *distributions)))
    if set(wanted) == set(protocol.distributions):
        return protocol
    return dataclasses.replace(protocol, name=protocol.name + "*", distributions=wanted)


def resolve_protocols(protocols: Sequence[Protocol | str]) -> list[Protocol]:
    resolved = [p if isinstance(p, Protocol) else get_protocol(p) for p in protocols]
    if not resolved:
        raise InputError("audit: no protocol given")
    return list({p.name: p for p in resolved}.values())


def with_identity_variants(protocols: list[Protocol], distributions: Sequence[str]) -> list[Protocol]:
    variants = {p.name: p for p in protocols}
    for p in protocols:
        variant = every_distribution(p, distributions)
        variants.setdefault(variant.name, variant)
    return list(variants.values())


def null_kernel_protocols(protocols: list[Protocol], settings: AuditSettings) -> dict[str, list[str]]:
    """Null kernel → the protocols `assess` judges it by (the worker tracks no others)."""
    return {kernel: sorted({p.name for protocol in protocols
                            for p in judged_protocols(kernel, protocol, settings.distributions)})
            for kernel in settings.null_kernels}


def read_by_mostly(input_set: dict) -> bool:
    """The sets the mostly-zero and mostly-mean rules read: the task's own shape, default weights, x1 inputs. The
    worker takes the fractions those rules need on these sets alone."""
    return (input_set["shape"] == "original" and input_set["weights"] == "default"
            and input_set["distribution"] == "x1")
