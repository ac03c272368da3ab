# kbverify-test: task=tasks/basic/level1/11_CrossEntropyLoss.py
# expect: original=passed verified=passed
# why: cross-entropy as logsumexp minus the gathered target logit; the int64 targets are used as indices
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        target_logit = predictions.gather(1, targets.unsqueeze(1)).squeeze(1)
        return torch.logsumexp(predictions, dim=1) - target_logit
