"""Search spaces that ship with autotune, written with its public Python API.

Each module defines ``space``: a :class:`autotune.SearchSpace`, or a function of the world
size that returns one. Name a module here (``quickstart``) or give a path to your own file.
"""
