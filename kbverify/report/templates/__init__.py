"""The HTML the reports write, rendered from the templates in this folder through jinja2 with autoescape on: every
value a template prints is escaped unless the code marks it safe, so a submission or task name (untrusted: it comes
from the published run) cannot add markup to a report. Only `kbverify.report.plots`' SVG enters marked safe; it escapes
its own labels."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2  # here, not at the top: importing kbverify stays light for commands that write no HTML

    return jinja2.Environment(loader=jinja2.PackageLoader("kbverify.report.templates", "."), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)


def render(name: str, **context) -> str:
    """The template `name` of this folder, filled with `context`."""
    return _environment().get_template(name).render(**context)


def safe(markup: str):
    """Text the caller has already escaped, to be printed as it is (SVG from `kbverify.report.plots`)."""
    import markupsafe

    return markupsafe.Markup(markup)
