from setuptools import find_packages, setup

setup(
    name='ada_loss',
    version='0.1.0',
    description='Adaptive loss scaling for mixed precision training '
                '(Chainer reimplementation)',
    packages=find_packages(include=['ada_loss', 'ada_loss.*']),
    python_requires='>=3.11',
    install_requires=[
        # Chainer 7.8.1 runs on NumPy 2 through ada_loss/_chainer_compat.py
        'numpy>=2',
        'scipy',
        'chainer==7.8.1',
        'chainercv==0.13.1',
        'PyYAML',
        # reference (and, where faster, implementation) of the number formats
        'ml_dtypes',
        # the APS codec's compiled kernels (ada_loss/communication/
        # kernels.py: the wire mode, the simulator); a core dependency
        # because the simulator (no MPI) uses them too
        'numba',
        'matplotlib',
        'scikit-learn',
        'Pillow',
        # ChainerCV's SSD training transforms (photometric distortion,
        # random-interpolation resize) need cv2.
        'opencv-python-headless',
        # every run's TensorBoard event files (tensorboardX's writer,
        # ada_loss/training/tensorboard.py) and the viewer itself
        # (`tensorboard --logdir results/`; its reader in the tests)
        'tensorboardX',
        'tensorboard',
    ],
    extras_require={
        'test': ['pytest', 'hypothesis'],
        'mpi': ['mpi4py', 'openmpi'],
        # CuPy 14 (no cuDNN) through ada_loss/_chainer_compat.py; see the
        # README's GPU section (scripts/wheelhouse.sh, scripts/gpu_check.sh).
        'gpu': ['cupy-cuda13x>=14'],
    },
)
