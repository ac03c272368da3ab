import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, embed_dim, num_heads):
        """
        Multi-head self-attention with separate query, key and value projections and an output projection.

        :param embed_dim: Embedding dimension
        :param num_heads: Number of attention heads
        """
        super(Model, self).__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(embed_dim, embed_dim)
        self.k = nn.Linear(embed_dim, embed_dim)
        self.v = nn.Linear(embed_dim, embed_dim)
        self.out = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        """
        :param x: Input tensor of shape (batch_size, seq_len, embed_dim)
        :return: Output tensor of shape (batch_size, seq_len, embed_dim)
        """
        b, n, e = x.shape
        h = self.num_heads

        def heads(t):
            return t.view(b, n, h, e // h).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = torch.softmax(q @ k.transpose(-2, -1) / (e // h) ** 0.5, dim=-1)
        return self.out((scores @ v).transpose(1, 2).reshape(b, n, e))


batch_size = 4
seq_len = 32
embed_dim = 64
num_heads = 4


def get_inputs():
    return [torch.rand(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads]
