"""The parent's processes and devices: the sandbox and its supervisor, confinement, the parent–worker channel, device
sharing, MPS, GPU processes, hang detection, toolchain and provenance probes, the input plan and the task probe, and
the runner that turns one (task, submission, protocol) into a verdict through the judge. Side: parent; it never
imports submission code or torch."""
