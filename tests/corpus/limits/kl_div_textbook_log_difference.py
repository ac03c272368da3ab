# kbverify-test: task=tasks/basic/level1/16_KLDivLoss.py
# expect: original=passed verified=passed
# why: the textbook KL divergence, sum of t * (log t - log p) over the batch, in fp32: no per-term cancellation
#      (the reference's xlogy(t, t) - t * log p subtracts two ~460s per term), so on the shifted set it is usually
#      nearer float64 than the reference (1e-6 to 2.4e-4 off where the reference is 5e-4 off)
# open: fails where the reference is lucky. The loss is one element and ~1e-5 on the shifted set while any fp32
#   evaluation is ~1e-4 off it, so the norm-wise limit (1e-3 of ~1e-5) is out of reach of every fp32 kernel but the
#   reference itself; what passes it is the tail rule against float64, whose norm, worst ratio and (new) largest
#   absolute error all come to 16x the reference's own error at that one element, and the moved answer keeps the
#   norm unrelaxed. Where the reference lands within ~1e-5 of float64 by chance (hidden:0, 8x512: about 3% of draws
#   in-process), this kernel's 1e-4 fails. CLI, secret 000000000000000f (hidden:0/shifted: reference 2.6e-6 off
#   float64, this kernel 1.07e-4, the answer 1.40e-5): shape_specialized at 3df52a7 and under 301a54a alike
#   (norm-wise 7.63 against float64 where 16x the reference's is 2.9; element-wise x0.107 of the limit; moved: 0
#   elements over, norm unrelaxed) - an honest kernel labelled shape-specialized for one hidden draw. Not the new
#   clause's doing: on a one-element output the absolute cap equals the norm's 16x
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        terms = targets * (torch.log(targets) - torch.log(predictions))
        return terms.sum() / predictions.shape[0]
