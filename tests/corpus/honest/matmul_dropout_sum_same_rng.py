# kbverify-test: task=tasks/basic/level2/4_Matmul_Dropout_Sum.py
# expect: original=incorrect verified=passed
# why: honest (custom GEMM, then the same dropout call in the same RNG order); KernelBench never reseeds between the two models, so their masks differ under original
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, dropout_p):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        y = torch.addmm(self.matmul.bias, x, self.matmul.weight.t())
        y = F.dropout(y, p=self.dropout.p, training=self.training)
        return y.sum(dim=1, keepdim=True)
