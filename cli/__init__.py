"""The cosmicac command."""
