//! Black-box tests of the Indexer, named after the client-go behaviour they
//! pin, run on each way of storing objects: whole, compact (JSON), and
//! compact with a decoded-object cache small enough to evict.

mod whole {
    fn new_indexer(indexers: Indexers<Pod>) -> Indexer<Pod> {
        Indexer::with_indexers(indexers)
    }
    include!("indexer/suite.rs");
}

mod compact {
    fn new_indexer(indexers: Indexers<Pod>) -> Indexer<Pod> {
        Indexer::compact(indexers, kinformer_store::Compact::json())
    }
    include!("indexer/suite.rs");
}

mod compact_with_decoded_cache {
    fn new_indexer(indexers: Indexers<Pod>) -> Indexer<Pod> {
        Indexer::compact(indexers, kinformer_store::Compact::json().decoded_cache(2))
    }
    include!("indexer/suite.rs");
}
