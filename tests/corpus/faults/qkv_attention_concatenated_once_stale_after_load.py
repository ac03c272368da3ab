# kbverify-test: task=tasks/basic/level3/5_QKV_Attention.py
# expect: original=passed verified=incorrect
# why: the concatenated QKV weight is made from q, k and v once, in __init__, and never again: right for the
#   weights it is built with, stale after a user's load_state_dict. Honest twin:
#   honest/qkv_attention_concatenated_rederived_in_load_state_dict
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
        with torch.no_grad():
            self.qkv_weight = torch.cat([self.q.weight, self.k.weight, self.v.weight]).detach()
            self.qkv_bias = torch.cat([self.q.bias, self.k.bias, self.v.bias]).detach()

    def forward(self, x):
        b, n, e = x.shape
        h = self.num_heads
        qkv = torch.addmm(self.qkv_bias, x.reshape(b * n, e), self.qkv_weight.t())
        q, k, v = qkv.view(b, n, 3, h, e // h).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-2, -1) / (e // h) ** 0.5, dim=-1)
        return self.out((scores @ v).transpose(1, 2).reshape(b, n, e))
