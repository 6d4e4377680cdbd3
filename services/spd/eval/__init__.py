"""Evaluation: prompt sets shipped in wheels, and exact acceptance without running cycles."""
