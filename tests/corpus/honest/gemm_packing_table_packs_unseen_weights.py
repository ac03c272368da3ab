# kbverify-test: task=tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py
# expect: original=passed verified=passed
# why: honest twin of exploits/gemm_repacks_only_weights_seen_at_construction: a process-wide table of packings,
#   keyed by the weight's exact bytes, reused when a loaded weight was packed before and packed anew otherwise
import torch
import torch.nn as nn

_PACKED = {}


def _packing(weight):
    key = (tuple(weight.shape), weight.detach().cpu().numpy().tobytes())
    if key not in _PACKED:
        _PACKED[key] = weight.detach().t().contiguous()
    return _PACKED[key]


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self._packed = _packing(self.gemm.weight)

    def load_state_dict(self, *args, **kwargs):
        result = super().load_state_dict(*args, **kwargs)
        self._packed = _packing(self.gemm.weight)
        return result

    def forward(self, x):
        return torch.relu(x @ self._packed.to(x.device)) + self.bias
