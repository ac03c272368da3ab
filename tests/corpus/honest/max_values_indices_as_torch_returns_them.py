# kbverify-test: task=tests/corpus/tasks/max_values_indices.py
# expect: original=runtime_error verified=passed
# as-user: on
# why: returns torch.max(x, dim)'s own torch.return_types.max, as the reference does; the set run as a user calls
#      it saves and reads back that type (a structseq torch.load's weights_only refuses) by name, so its output
#      compares like the harness's calls' (red team F3: it was rejected as an output that cannot be read back).
#      `original` is KernelBench's own check, whose `output.shape` fails on any tuple output, the reference's too
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor):
        return torch.max(x, dim=self.dim)
