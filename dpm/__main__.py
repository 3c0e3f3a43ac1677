"`python -m dpm ...` is the console script `dpm ...`; `torchrun -m dpm train ...` trains with DDP."
from dpm.cli import main

if __name__ == "__main__": main()
