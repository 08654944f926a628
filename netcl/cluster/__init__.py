"""Clustering on the device: k-means with scikit-learn's interface (KMeans, MiniBatchKMeans, kmeans_plusplus).

    from netcl.cluster import KMeans
    km = KMeans(n_clusters=10, random_state=0).fit(X)     # X: a NumPy array or a netcl Tensor
    km.labels_, km.cluster_centers_, km.inertia_, km.predict(X_new)

The assignment step is one kernel (distances and the arg-min fused: no n_samples x n_clusters matrix at
any size), the update a segmented sum per cluster, k-means++ runs on the device, and arrays larger than
the device are streamed from host memory in chunks. Kernels: netcl.ops.kmeans.
"""

from netcl.cluster.data import NonFiniteError
from netcl.cluster.kmeans import ConvergenceWarning, KMeans, NotFittedError
from netcl.cluster.minibatch import MiniBatchKMeans
from netcl.cluster.seeding import kmeans_plusplus

__all__ = [
    "ConvergenceWarning",
    "KMeans",
    "MiniBatchKMeans",
    "NonFiniteError",
    "NotFittedError",
    "kmeans_plusplus",
]
