"""Adversarial attacks and their losses: `attack(model, x, y) -> x_adv` (DESIGN.md §4)."""
