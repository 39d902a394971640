from setuptools import find_packages, setup

setup(
    name='ada_loss',
    version='0.1.0',
    description='Adaptive loss scaling for mixed precision training '
                '(Chainer reimplementation)',
    packages=find_packages(include=['ada_loss', 'ada_loss.*']),
    python_requires='>=3.8',
    install_requires=[
        'setuptools<74',   # chainer 7 imports pkg_resources at run time
        'numpy>=1.20,<1.24',
        'scipy',
        'chainer==7.8.1',
        'chainercv==0.13.1',
        'PyYAML',
        # reference (and, where faster, implementation) of the number formats
        'ml_dtypes',
        'matplotlib',
        'scikit-learn',
        'Pillow',
        # ChainerCV's SSD training transforms (photometric distortion,
        # random-interpolation resize) need cv2.
        'opencv-python-headless',
    ],
    extras_require={
        'test': ['pytest'],
        'mpi': ['mpi4py', 'openmpi'],
        # Chainer 7.8.1 supports CuPy v7 only (cupy-cudaXXX 7.8.x): Python <= 3.8,
        # NumPy <= 1.19, CUDA 9.0-11.0. Not run in this project's CI.
        'gpu': ['cupy>=7.7,<8'],
    },
)
