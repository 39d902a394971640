"""A real HTTP server on 127.0.0.1 for the fetch tests, and archives in the
publishers' layouts to serve.

:class:`LocalServer` runs :mod:`http.server` in a thread on an ephemeral
port; each file is served in one of these ways:

* ``'good'``: the bytes with their Content-Length;
* ``'truncated'``: a Content-Length larger than the body, then the
  connection closed (a download cut short);
* ``'stall'``: the headers and half the body, then nothing until the
  server closes (longer than the client's timeout);
* ``'nolength'``: the bytes with no Content-Length, then the connection
  closed (the client reads to the end).

A corrupted file is a good one whose bytes differ from what the checksum
table expects. Nothing here reaches the internet.
"""
import gzip
import http.server
import io
import os
import pickle
import tarfile
import threading

import numpy


class LocalServer(object):

    def __init__(self):
        self.files = {}         # name -> (bytes, behaviour)
        self.requests = []      # names requested, in order
        self._release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.lstrip('/')
                server.requests.append(name)
                if name not in server.files:
                    self.send_error(404)
                    return
                data, how = server.files[name]
                self.send_response(200)
                self.send_header('Content-Type', 'application/octet-stream')
                extra = 1000 if how == 'truncated' else 0
                if how != 'nolength':
                    self.send_header('Content-Length', str(len(data) + extra))
                self.end_headers()
                if how == 'stall':
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    server._release.wait(30)
                    return
                self.wfile.write(data)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0),
                                                      Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        daemon=True)

    @property
    def url(self):
        return 'http://127.0.0.1:{}/'.format(self._httpd.server_address[1])

    def serve(self, name, data, how='good'):
        self.files[name] = (data, how)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def _tar(members):
    """A ``.tar.gz`` (name ending ``.gz``) or ``.tar`` holding ``{path:
    bytes}``, as bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w:gz') as tar:
        for path, data in sorted(members.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def cifar10_tarball(n_per_batch=4, seed=0):
    """``cifar-10-python.tar.gz`` in the publisher's layout
    (``cifar-10-batches-py/data_batch_1..5``, ``test_batch``,
    ``batches.meta``: protocol-2 pickles of dicts with ``str`` keys, as
    Python 2 wrote them) with ``n_per_batch`` random 32x32 images a file;
    returns ``(bytes, {file: (data, labels)})``."""
    rng = numpy.random.RandomState(seed)
    members, truth = {}, {}
    for name in ['data_batch_%d' % i for i in range(1, 6)] + ['test_batch']:
        data = rng.randint(0, 256, (n_per_batch, 3072)).astype(numpy.uint8)
        labels = [int(v) for v in rng.randint(0, 10, n_per_batch)]
        members['cifar-10-batches-py/' + name] = pickle.dumps(
            {'batch_label': name, 'data': data, 'labels': labels},
            protocol=2)
        truth[name] = (data, labels)
    members['cifar-10-batches-py/batches.meta'] = pickle.dumps(
        {'label_names': ['airplane', 'automobile', 'bird', 'cat', 'deer',
                         'dog', 'frog', 'horse', 'ship', 'truck'],
         'num_cases_per_batch': n_per_batch, 'num_vis': 3072}, protocol=2)
    return _tar(members), truth


def idx_gz(array):
    """An array as a gzipped IDX file (unsigned bytes)."""
    array = numpy.asarray(array, numpy.uint8)
    header = (0x0800 + array.ndim).to_bytes(4, 'big') + b''.join(
        d.to_bytes(4, 'big') for d in array.shape)
    return gzip.compress(header + array.tobytes(), mtime=0)


def fashion_mnist_files(n_train=12, n_test=6, seed=0):
    """The four Fashion-MNIST ``.gz`` files: ``{name: bytes}``."""
    rng = numpy.random.RandomState(seed)
    out = {}
    for prefix, n in (('train', n_train), ('t10k', n_test)):
        out[prefix + '-images-idx3-ubyte.gz'] = idx_gz(
            rng.randint(0, 256, (n, 28, 28)))
        out[prefix + '-labels-idx1-ubyte.gz'] = idx_gz(numpy.arange(n) % 10)
    return out


def voc_tarballs(devkit_parent):
    """The three VOC tarballs (``{name: bytes}``) cut from a VOCdevkit
    written by ``ondisk_fixtures.make_vocdevkit`` under ``devkit_parent``:
    2007 trainval without the test list, 2007 test without the trainval
    list, 2012 trainval -- each holding ``VOCdevkit/VOC<year>/...`` as the
    publisher's do."""
    def files(year, skip):
        out = {}
        base = os.path.join(devkit_parent, 'VOCdevkit', 'VOC' + year)
        for folder, _, names in os.walk(base):
            for n in names:
                path = os.path.join(folder, n)
                rel = os.path.relpath(path, devkit_parent).replace(os.sep,
                                                                   '/')
                if not rel.endswith('/' + skip):
                    with open(path, 'rb') as f:
                        out[rel] = f.read()
        return out

    def plain_tar(members):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode='w') as tar:
            for path, data in sorted(members.items()):
                info = tarfile.TarInfo(path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()
    return {
        'VOCtrainval_06-Nov-2007.tar': plain_tar(files('2007', 'test.txt')),
        'VOCtest_06-Nov-2007.tar': plain_tar(files('2007', 'trainval.txt')),
        'VOCtrainval_11-May-2012.tar': plain_tar(files('2012', 'test.txt')),
    }
