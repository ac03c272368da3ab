import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, num_classes):
        """
        A small LeNet-style convolutional network.

        :param num_classes: The number of output classes.
        """
        super(Model, self).__init__()
        self.conv1 = nn.Conv2d(in_channels=3, out_channels=8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(in_channels=8, out_channels=16, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((4, 4))
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x):
        """
        :param x: The input tensor, shape (batch_size, 3, height, width)
        :return: The output tensor, shape (batch_size, num_classes)
        """
        x = F.max_pool2d(F.relu(self.conv1(x)), kernel_size=2, stride=2)
        x = F.relu(self.conv2(x))
        x = self.pool(x)
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


batch_size = 8
num_classes = 10
height = width = 32


def get_inputs():
    return [torch.rand(batch_size, 3, height, width)]


def get_init_inputs():
    return [num_classes]
