"""Argument rules: dtypes, shapes and strides, modifiers, descales, varlen offsets, and the validated Problem."""
