"""What ran: the build record, the code-path warnings and the isolation a verdict reports. Pure."""

from __future__ import annotations

from kbverify.core.records import BuildRecord
from kbverify.core.status import Warn
from kbverify.judge.static import StaticScan, classify_build_error


def build_record(static: StaticScan, extensions: dict | None) -> BuildRecord:
    extensions = extensions or {}
    attempts = extensions.get("attempts", 0)
    built = extensions.get("built", 0) > 0 if attempts else (None if not static.native_sources else False)
    errors = extensions.get("errors") or []
    error = errors[-1] if errors else ""
    return BuildRecord(native_sources=static.native_sources, extension_built=built,
                       extension_called=(extensions.get("calls", 0) > 0) if built else None,
                       error_class=classify_build_error(error) if error else None, error=error[-3000:],
                       triton=static.triton, triton_kernels_run=_count_or_none(extensions.get("triton_kernels_run")))


def _count_or_none(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def code_path_warnings(static: StaticScan, build: BuildRecord) -> list[str]:
    warnings: list[str] = []
    if static.syntax_error:
        return warnings
    if static.native_sources and not build.extension_built:
        warnings.append(Warn.EXTENSION_NOT_BUILT.value)
    # what ran, where it is known: a triton import whose kernels never compiled is no custom code (an unknown
    # count keeps the static scan's reading)
    triton_ran = static.triton and build.triton_kernels_run != 0
    native_ran = static.native_sources and build.extension_called is not False
    if not static.has_custom_code or not (triton_ran or native_ran):
        warnings.append(Warn.PYTORCH_ONLY.value)
    return warnings


def isolation(reported: dict, ran_submission: bool) -> tuple[str, str]:
    """Degraded if any process that ran the submission's code ran unconfined. `reported`: "isolated" /
    "degraded" → why, as the submission's workers reported it."""
    if "degraded" in reported:
        return "degraded", reported["degraded"]
    if "isolated" in reported:
        return "isolated", reported["isolated"]
    if not ran_submission:
        # rejected before any process ran its code (it did not parse, has no ModelNew): nothing to confine
        return "not_run", "no process ran the submission's code"
    return "degraded", "no process reported how it was confined"
