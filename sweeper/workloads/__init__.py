"""What is trained and measured: one module per built-in model (mlp.py, vision.py for torchvision,
gpt.py, hf.py) and per data family (images.py: digits, cifar10, synthetic; text.py: text and tokens), the
user's own factories (factory.py), and the two registries that find them by name (models.py, datasets.py).
They read the typed config (sweeper.config; each built-in model's own fields and checks are
config/model_sections.py), which never imports them. docs/adding-a-workload.md says how to add one."""
