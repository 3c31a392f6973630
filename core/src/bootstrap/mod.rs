//! Bootstrap: rank and world from the launcher's environment, and the TCP store ranks rendezvous
//! through.
