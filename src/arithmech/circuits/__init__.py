"""Edge-level circuits (MIB): nodes, edges, exact patched evaluation, edge attribution, faithfulness."""
