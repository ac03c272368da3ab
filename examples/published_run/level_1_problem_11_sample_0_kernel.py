import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        target_logit = predictions.gather(1, targets.unsqueeze(1)).squeeze(1)
        return torch.logsumexp(predictions, dim=1) - target_logit
