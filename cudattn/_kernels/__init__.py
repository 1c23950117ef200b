"""Kernel variants, the registry that compiles and loads them, and the plans and parameter blocks they launch with."""
