"""Hidden shapes: a task's source read for its size constants (`task_constants`), probed on torch's meta device
(`meta_probe`), and rewritten to larger shapes (`hidden`, `hidden_larger`). Side: both (the parent plans the shapes,
a worker loads them); torch only on the meta device and the CPU, imported inside functions."""
