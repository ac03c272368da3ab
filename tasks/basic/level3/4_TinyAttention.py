import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, embed_dim, num_heads):
        """
        A single pre-norm self-attention block with a residual connection.

        :param embed_dim: Embedding dimension
        :param num_heads: Number of attention heads
        """
        super(Model, self).__init__()
        self.norm = nn.LayerNorm(embed_dim)
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        """
        :param x: Input tensor of shape (batch_size, seq_len, embed_dim)
        :return: Output tensor of shape (batch_size, seq_len, embed_dim)
        """
        h = self.norm(x)
        attn_output, _ = self.attn(h, h, h, need_weights=False)
        return x + attn_output


batch_size = 8
seq_len = 32
embed_dim = 64
num_heads = 4


def get_inputs():
    return [torch.rand(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads]
