import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers=2, bias=True, batch_first=False):
        """
        :param input_size: The number of expected features in the input x
        :param hidden_size: The number of features in the hidden state h
        :param num_layers: Number of recurrent layers (default: 2)
        :param bias: If False, then the layer does not use bias weights b_ih and b_hh (default: True)
        :param batch_first: If True, the input and output tensors are provided as (batch, seq, feature)
        """
        super(Model, self).__init__()
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        self.gru = nn.GRU(input_size, hidden_size, num_layers, bias, batch_first, dropout=0, bidirectional=False)

    def forward(self, x):
        """
        :param x: The input tensor, shape (seq_len, batch_size, input_size)
        :return: output, shape (seq_len, batch_size, hidden_size)
        """
        # The initial state is random and drawn here, from torch's generator, as KernelBench's RNN tasks do.
        h0 = torch.randn(self.num_layers, x.size(1), self.hidden_size, device=x.device, dtype=x.dtype)
        output, h_n = self.gru(x, h0)
        return output


batch_size = 8
seq_len = 16
input_size = 32
hidden_size = 64
num_layers = 2


def get_inputs():
    return [torch.rand(seq_len, batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers]
