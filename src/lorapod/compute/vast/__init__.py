"""Vast.ai: offers (bundles), create (asks), instances."""
