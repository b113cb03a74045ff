"""gpuenv: declarative provisioning of deep-learning GPU hosts."""

__version__ = "0.1.0"
