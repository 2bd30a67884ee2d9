"""The Hopper (sm_90) kernels in Gluon. Importing this package imports no Gluon."""
