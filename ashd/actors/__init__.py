"""Actors (pykka) and the one asyncio↔actor bridge."""
