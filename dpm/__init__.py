__version__ = "0.1.0"
# Written by hand, not exported: nbdev keeps this file and updates only the version line above.
# The chapters after 01 add methods to the diffusion classes of `dpm.diffusion` with fastcore's
# @patch (`d.bound`, `d.entropy_bounds`, `d.sample_posterior`, ...). `dpm.diffusion` imports none
# of them (they import it); importing them here, when the package loads, means that
# `from dpm.diffusion import GaussianDiffusion` always gives the complete class.
# Appendix A6, first: on Linux with glibc, freed tensors' memory is kept for reuse (DPM_KEEP_MEMORY=0
# turns it off), before anything large is allocated.
from . import cpu_memory  # noqa: E402,F401
from . import bound, entropy, posterior  # noqa: E402,F401
