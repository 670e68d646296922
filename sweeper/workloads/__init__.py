"""What is trained and measured: one module per built-in model (mlp.py, vision.py for torchvision,
gpt.py, hf.py; each built-in model's own config fields and checks beside it, torch-free: mlp_config.py,
gpt_config.py, hf_config.py) and per data family (images.py: digits, cifar10, synthetic; text.py: text and tokens),
the user's own factories (factory.py), and the two registries that find them by name (models.py,
datasets.py). docs/adding-a-workload.md says how to add one."""
