# kbverify-test: task=tasks/basic/level3/1_MLP.py
# expect: original=passed verified=passed
# why: the MLP as a chain of addmm + in-place ReLU on intermediates; same Sequential, so the state_dict keys match
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers = []
        current_input_size = input_size
        for layer_size in layer_sizes:
            layers.append(nn.Linear(current_input_size, layer_size))
            layers.append(nn.ReLU())
            current_input_size = layer_size
        layers.append(nn.Linear(current_input_size, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        linears = [m for m in self.network if isinstance(m, nn.Linear)]
        h = x
        for linear in linears[:-1]:
            h = torch.addmm(linear.bias, h, linear.weight.t()).relu_()
        last = linears[-1]
        return torch.addmm(last.bias, h, last.weight.t())
