"""The vocabulary every layer shares: errors, operand forms (packed batches, lists, their
frameworks), the task graph and its task kinds, and the compiled-loop helper. It imports
nothing else of vbatch."""
