"""What a person reads: the report summary, Markdown/JSON/HTML reports (`write`), leaderboards, tables, plots, and the
jinja2 templates (autoescape on). Side: pure (files written, nothing started)."""
