"""The parent's timing: the driver of the timing workers' rounds, the estimate and its confirmation (`timing_control`;
`process_tree` stops the candidate's processes while the reference is timed), the timing modes (`timing_modes`) and
the two clocks (`clocks`). Side: parent; it starts workers only through `kbverify.harness.sandbox`, imported where
it runs them, so the judge can import its pure rules."""
