"""Where user methods run: threads of this process, worker processes, and the loop under them."""
