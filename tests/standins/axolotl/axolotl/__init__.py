"""STAND-IN package for axolotl (tests only): see cli/train.py."""
