"""StableHLO lowerings of ATen ops, grouped by op family; importing fills `registry.REGISTRY`."""
from . import elementwise, functional  # noqa: F401
from . import linalg, convolution, pooling  # noqa: F401
from . import reduction, softmax_loss, normalization  # noqa: F401
from . import random, factory, foreach, optimizers  # noqa: F401
from . import indexing, shape  # noqa: F401
from . import sorting  # noqa: F401
from . import linalg_decomp  # noqa: F401
from . import linalg_eig  # noqa: F401
from . import upsample  # noqa: F401
from . import special  # noqa: F401
from . import complex, fft  # noqa: F401
from . import bags  # noqa: F401
from . import amp  # noqa: F401
from . import attention, fast_path  # noqa: F401
from . import collectives  # noqa: F401
from . import rnn  # noqa: F401
from . import nested  # noqa: F401
