# kbverify-test: task=tasks/basic/level3/5_QKV_Attention.py
# expect: original=passed verified=passed
# why: keeps the query, key and value projections as one fused parameter pair (another layout than Model's, so
#   its state_dict pairs with Model's neither by name nor by value); its _load_from_state_dict concatenates
#   Model's q, k and v entries into it, so weights reach it through load_state_dict under Model's names
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        # drawn as Model draws them (q, k, v, then out), so the default initialisation is Model's
        q, k, v = (nn.Linear(embed_dim, embed_dim) for _ in range(3))
        self.qkv_weight = nn.Parameter(torch.cat([q.weight, k.weight, v.weight]).detach())
        self.qkv_bias = nn.Parameter(torch.cat([q.bias, k.bias, v.bias]).detach())
        self.out = nn.Linear(embed_dim, embed_dim)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if prefix + "q.weight" in state_dict:  # Model's layout (the dict is load_state_dict's own copy)
            for name in ("weight", "bias"):
                parts = [state_dict.pop(f"{prefix}{p}.{name}") for p in "qkv"]
                state_dict[f"{prefix}qkv_{name}"] = torch.cat(parts)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x):
        b, n, e = x.shape
        h = self.num_heads
        qkv = torch.addmm(self.qkv_bias, x.reshape(b * n, e), self.qkv_weight.t())
        q, k, v = qkv.view(b, n, 3, h, e // h).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-2, -1) / (e // h) ** 0.5, dim=-1)
        return self.out((scores @ v).transpose(1, 2).reshape(b, n, e))
