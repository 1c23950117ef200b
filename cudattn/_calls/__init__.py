"""The call object every public entry uses: operands adapted, stream chosen, signature keyed, recorded and replayed."""
