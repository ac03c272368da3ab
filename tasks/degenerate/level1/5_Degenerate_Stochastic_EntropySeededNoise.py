import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Degenerate on purpose (stochastic even with reseeding): the noise comes from a private generator seeded from
    the operating system's entropy inside forward, so reseeding torch's global generators does not fix it.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator(device=x.device)
        generator.seed()
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return x + noise


batch_size = 16
dim = 512


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
