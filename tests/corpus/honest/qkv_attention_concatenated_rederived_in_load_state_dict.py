# kbverify-test: task=tasks/basic/level3/5_QKV_Attention.py
# expect: original=passed verified=passed
# why: keeps Model's q, k, v and out layers (its state_dict is Model's) and projects with one concatenated QKV
#   weight made from them in __init__, and made again by its load_state_dict override, so loaded weights reach it
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(embed_dim, embed_dim)
        self.k = nn.Linear(embed_dim, embed_dim)
        self.v = nn.Linear(embed_dim, embed_dim)
        self.out = nn.Linear(embed_dim, embed_dim)
        self._concatenate()

    def _concatenate(self):
        with torch.no_grad():
            self.qkv_weight = torch.cat([self.q.weight, self.k.weight, self.v.weight]).detach()
            self.qkv_bias = torch.cat([self.q.bias, self.k.bias, self.v.bias]).detach()

    def load_state_dict(self, state_dict, strict=True, assign=False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._concatenate()
        return result

    def forward(self, x):
        b, n, e = x.shape
        h = self.num_heads
        qkv = torch.addmm(self.qkv_bias, x.reshape(b * n, e), self.qkv_weight.t())
        q, k, v = qkv.view(b, n, 3, h, e // h).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-2, -1) / (e // h) ** 0.5, dim=-1)
        return self.out((scores @ v).transpose(1, 2).reshape(b, n, e))
