//! Derive macros for [calm](https://docs.rs/calm): a struct whose fields are
//! calm states is a state itself.
//!
//! Use them through `calm` with its `derive` feature, which re-exports each
//! macro next to the trait of the same name (`calm::Merge`,
//! `calm::DeltaMerge`, `calm::codec::Codec`), the way serde does:
//!
//! ```toml
//! calm = { version = "0.1", features = ["derive"] }
//! ```
//!
//! - [`Merge`](macro@Merge): merge field by field. The product of
//!   semilattices is a semilattice, so the merge laws hold because they hold
//!   for every field.
//! - [`DeltaMerge`](macro@DeltaMerge): the summary a peer sends is a tuple
//!   with one summary (version vector) per field, and a delta is a delta
//!   per field. The fields' vectors are not joined into one: each field
//!   counts its replicas' updates on its own scale.
//! - [`Codec`](macro@Codec): the fields in order, each in calm's binary
//!   format; with `#[calm(tag = N)]` (128 to 255) the struct also gets a
//!   type tag, so [`to_bytes`] writes it with calm's header and
//!   [`from_bytes`] checks that header.
//!
//! The three are separate so a type takes only what it supports (a struct
//! with a field that has no delta can still derive `Merge` and `Codec`).
//! Structs with named fields and tuple structs are supported; enums, unions
//! and structs without fields are refused with an error at the offending
//! item.
//!
//! The generated code names `::calm::...`, so `calm` must be a direct
//! dependency of the crate that derives.
//!
//! # Examples
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::codec::{self, Codec};
//! use calm::{DeltaMerge, LwwRegister, Merge, OrSet, PnCounter};
//!
//! #[derive(Clone, Debug, Default, PartialEq, Merge, DeltaMerge, Codec)]
//! #[calm(tag = 200)]
//! struct Cart {
//!     items: OrSet<String>,
//!     total: PnCounter,
//!     note: LwwRegister<String>,
//! }
//!
//! let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
//! let mut at_a = Cart::default();
//! at_a.items.insert(a, "apples".to_string());
//! at_a.total.increment(a, 3);
//! let mut at_b = at_a.clone();
//! at_b.note.set(b, "leave at the door".to_string());
//!
//! // a asks b for what it lacks: one delta, as bytes, for the whole cart.
//! let wire = codec::to_bytes(&at_b.delta(&at_a.version_vector()));
//! at_a.merge(&codec::from_bytes(&wire)?);
//! assert_eq!(at_a, at_b);
//! # Ok::<(), calm::codec::DecodeError>(())
//! ```
//!
//! [`to_bytes`]: https://docs.rs/calm/latest/calm/codec/fn.to_bytes.html
//! [`from_bytes`]: https://docs.rs/calm/latest/calm/codec/fn.from_bytes.html
#![deny(missing_docs)]
#![deny(unsafe_code)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Error, Index, LitInt, Member, Type, parse_macro_input};

/// Implements `calm::Merge` by merging every field.
///
/// Each field must implement `Merge`. Merging field by field is the product
/// lattice: commutative, associative, idempotent and monotone because every
/// field is.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{GCounter, GSet, Merge};
///
/// #[derive(Clone, Debug, Default, PartialEq, Merge)]
/// struct Visits {
///     pages: GSet<String>,
///     count: GCounter,
/// }
///
/// let mut x = Visits::default();
/// x.count.increment(ReplicaId::new(1), 2);
/// let mut y = Visits::default();
/// y.pages.insert("/".to_string());
/// x.merge(&y);
/// assert_eq!((x.pages.len(), x.count.value()), (1, 2));
/// ```
///
/// An enum is refused: which variant wins is a choice only the type can
/// make.
///
/// ```compile_fail
/// use calm::Merge;
///
/// #[derive(Merge)]
/// enum Status { Open, Closed }
/// ```
#[proc_macro_derive(Merge, attributes(calm))]
pub fn derive_merge(input: TokenStream) -> TokenStream {
    let ast = parse_macro_input!(input as DeriveInput);
    emit(expand_merge(&ast))
}

/// Implements `calm::DeltaMerge`: per-field summaries and per-field deltas.
///
/// Each field must implement `DeltaMerge`, and the struct `Merge` (derive
/// both). `Summary` is the tuple of the fields' summaries, in field order
/// (past 12 fields, tuples of up to 12 nested in a tuple), so a peer that
/// reports it gets back, for every field, exactly what that field lacks.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{DeltaMerge, Merge, OrSet, PnCounter};
///
/// #[derive(Clone, Debug, Default, PartialEq, Merge, DeltaMerge)]
/// struct Stock {
///     skus: OrSet<u32>,
///     units: PnCounter,
/// }
///
/// let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
/// let mut x = Stock::default();
/// for sku in 0..100 {
///     x.skus.insert(a, sku);
/// }
/// let mut y = x.clone();
/// y.units.increment(b, 5);
///
/// let delta = y.delta(&x.version_vector());
/// assert!(delta.skus.is_empty()); // nothing new in the set
/// x.merge(&delta);
/// assert_eq!(x, y);
/// ```
#[proc_macro_derive(DeltaMerge, attributes(calm))]
pub fn derive_delta_merge(input: TokenStream) -> TokenStream {
    let ast = parse_macro_input!(input as DeriveInput);
    emit(expand_delta_merge(&ast))
}

/// Implements `calm::codec::Codec` (and `Tagged` with `#[calm(tag = N)]`).
///
/// The encoding is the fields in order, each in calm's binary format, with
/// no framing of its own (every field frames itself, as tuples do).
/// Decoding is as strict as each field's: any malformed input is a
/// `DecodeError`, never a panic or an allocation the input cannot justify.
///
/// `#[calm(tag = N)]`, with `N` from 128 to 255 (calm keeps the tags below
/// 128 for its own types), also implements `Tagged`, so `calm::codec`'s
/// `to_bytes` writes the struct with the format version and this tag, and
/// `from_bytes` refuses bytes of any other type. Give each of your types
/// its own tag. Without it, the struct is a `Codec` for use inside other
/// values (an element of an `OrSet`, a field of another struct).
///
/// # Examples
///
/// ```
/// use calm::codec::{self, Codec};
/// use calm::{GSet, Merge};
///
/// // An element type: fields of plain values.
/// #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Codec)]
/// struct Point { x: i64, y: i64 }
///
/// // A state: one tagged top-level type.
/// #[derive(Clone, Debug, Default, PartialEq, Merge, Codec)]
/// #[calm(tag = 130)]
/// struct Drawing { points: GSet<Point> }
///
/// let mut d = Drawing::default();
/// d.points.insert(Point { x: -1, y: 300 });
/// let bytes = codec::to_bytes(&d);
/// assert_eq!(codec::from_bytes::<Drawing>(&bytes)?, d);
/// // Another type's bytes are refused by the tag, not misread.
/// assert!(codec::from_bytes::<GSet<Point>>(&bytes).is_err());
/// # Ok::<(), calm::codec::DecodeError>(())
/// ```
///
/// A tag in calm's own range is refused:
///
/// ```compile_fail
/// use calm::codec::Codec;
///
/// #[derive(Codec)]
/// #[calm(tag = 7)]
/// struct Mine { n: u64 }
/// ```
#[proc_macro_derive(Codec, attributes(calm))]
pub fn derive_codec(input: TokenStream) -> TokenStream {
    let ast = parse_macro_input!(input as DeriveInput);
    emit(expand_codec(&ast))
}

/// The generated code, or the errors as `compile_error!`s at their spans.
fn emit(expanded: syn::Result<TokenStream2>) -> TokenStream {
    expanded.unwrap_or_else(Error::into_compile_error).into()
}

/// The most summaries one tuple holds: calm implements its traits for
/// tuples of up to 12 elements, as the standard library does.
const TUPLE_MAX: usize = 12;

/// What the derives read from a struct.
struct Input<'a> {
    /// The struct.
    ast: &'a DeriveInput,
    /// Its fields in declaration order: how to name each one, and its type.
    fields: Vec<(Member, &'a Type)>,
    /// The value of `#[calm(tag = N)]`, if given.
    tag: Option<u8>,
}

impl<'a> Input<'a> {
    /// Reads `ast`, refusing what `derive` (the trait's name) cannot
    /// support, with the error on the offending item.
    fn parse(ast: &'a DeriveInput, derive: &str) -> syn::Result<Self> {
        let fields = match &ast.data {
            Data::Struct(s) => &s.fields,
            Data::Enum(e) => {
                return Err(Error::new(
                    e.enum_token.span(),
                    format!(
                        "`#[derive({derive})]` supports structs, not enums: which variant wins \
                         when replicas disagree is a choice the type must make, so implement \
                         `{derive}` by hand (or keep the variant in an `LwwRegister`)"
                    ),
                ));
            }
            Data::Union(u) => {
                return Err(Error::new(
                    u.union_token.span(),
                    format!("`#[derive({derive})]` supports structs, not unions"),
                ));
            }
        };
        if fields.is_empty() {
            return Err(Error::new(
                ast.ident.span(),
                format!(
                    "`#[derive({derive})]` needs a struct with at least one field: `{}` has \
                     no state to merge or encode",
                    ast.ident
                ),
            ));
        }
        for field in fields {
            if let Some(attr) = field.attrs.iter().find(|a| a.path().is_ident("calm")) {
                return Err(Error::new(
                    attr.span(),
                    "calm's derives take no field attributes: every field is merged, \
                     delta-synced and encoded as its own type says",
                ));
            }
        }
        let fields = fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let member = match &f.ident {
                    Some(name) => Member::Named(name.clone()),
                    None => Member::Unnamed(Index {
                        index: i as u32,
                        span: f.ty.span(),
                    }),
                };
                (member, &f.ty)
            })
            .collect();
        Ok(Self {
            ast,
            fields,
            tag: parse_tag(ast)?,
        })
    }

    /// The impl header's generics, with `field type: bound` added for every
    /// field whose type names a type parameter. Fields of concrete types
    /// need no bound: the generated calls are spanned at each field, so a
    /// field that is not a state is reported where it is declared.
    fn generics(&self, bound: &TokenStream2) -> syn::Generics {
        let mut generics = self.ast.generics.clone();
        let params: Vec<_> = generics.type_params().map(|p| p.ident.clone()).collect();
        let clause = generics.make_where_clause();
        for (_, ty) in &self.fields {
            if mentions(quote!(#ty), &params) {
                clause.predicates.push(syn::parse_quote!(#ty: #bound));
            }
        }
        generics
    }

    /// `impl<..> #trait_path for Name<..> where ..` with the field bounds.
    fn impl_header(&self, trait_path: &TokenStream2, bound: &TokenStream2) -> TokenStream2 {
        let generics = self.generics(bound);
        let (impl_generics, _, where_clause) = generics.split_for_impl();
        let (_, ty_generics, _) = self.ast.generics.split_for_impl();
        let name = &self.ast.ident;
        quote!(impl #impl_generics #trait_path for #name #ty_generics #where_clause)
    }

    /// `call(member, span)` for every field, where `span` is the field
    /// type's: code built with it reports errors at the field.
    fn per_field(&self, call: impl Fn(&Member, Span) -> TokenStream2) -> Vec<TokenStream2> {
        self.fields
            .iter()
            .map(|(member, ty)| call(member, ty.span()))
            .collect()
    }
}

/// Whether `tokens` name any of `params`.
fn mentions(tokens: TokenStream2, params: &[syn::Ident]) -> bool {
    tokens.into_iter().any(|t| match t {
        proc_macro2::TokenTree::Ident(i) => params.contains(&i),
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), params),
        _ => false,
    })
}

/// Reads `#[calm(tag = N)]` from the struct's attributes.
fn parse_tag(ast: &DeriveInput) -> syn::Result<Option<u8>> {
    let mut tag = None;
    for attr in ast.attrs.iter().filter(|a| a.path().is_ident("calm")) {
        attr.parse_nested_meta(|meta| {
            if !meta.path.is_ident("tag") {
                return Err(meta.error("unknown calm attribute: expected `tag = N`"));
            }
            let lit: LitInt = meta.value()?.parse()?;
            let value = lit
                .base10_parse::<u8>()
                .ok()
                .filter(|v| *v >= 128)
                .ok_or_else(|| {
                    Error::new(
                        lit.span(),
                        "a type tag of your own is 128 to 255 (calm keeps 0 to 127 for its \
                         own types)",
                    )
                })?;
            if tag.replace(value).is_some() {
                return Err(Error::new(lit.span(), "the type tag is given twice"));
            }
            Ok(())
        })?;
    }
    Ok(tag)
}

fn expand_merge(ast: &DeriveInput) -> syn::Result<TokenStream2> {
    let input = Input::parse(ast, "Merge")?;
    let merge = quote!(::calm::Merge);
    let header = input.impl_header(&merge, &merge);
    let merges = input
        .per_field(|m, span| quote_spanned!(span=> ::calm::Merge::merge(&mut self.#m, &other.#m);));
    Ok(quote! {
        #header {
            fn merge(&mut self, other: &Self) {
                #(#merges)*
            }
        }
    })
}

fn expand_delta_merge(ast: &DeriveInput) -> syn::Result<TokenStream2> {
    let input = Input::parse(ast, "DeltaMerge")?;
    let delta = quote!(::calm::DeltaMerge);
    let header = input.impl_header(&delta, &delta);
    let shape = Shape::of(input.fields.len());
    let summary_ty = shape.to_tokens(&|i| {
        let ty = input.fields[i].1;
        quote_spanned!(ty.span()=> <#ty as ::calm::DeltaMerge>::Summary)
    });
    let summary = shape.to_tokens(&|i| {
        let (member, ty) = &input.fields[i];
        quote_spanned!(ty.span()=> ::calm::DeltaMerge::version_vector(&self.#member))
    });
    let mut paths = vec![Vec::new(); input.fields.len()];
    shape.paths(&mut Vec::new(), &mut paths);
    let deltas = input.fields.iter().zip(&paths).map(|((member, ty), path)| {
        let path = path.iter().map(|&i| Index::from(i));
        quote_spanned!(ty.span()=> #member: ::calm::DeltaMerge::delta(&self.#member, &since #(.#path)*))
    });
    Ok(quote! {
        #header {
            type Summary = #summary_ty;

            fn version_vector(&self) -> Self::Summary {
                #summary
            }

            fn delta(&self, since: &Self::Summary) -> Self {
                Self { #(#deltas,)* }
            }
        }
    })
}

fn expand_codec(ast: &DeriveInput) -> syn::Result<TokenStream2> {
    let input = Input::parse(ast, "Codec")?;
    let codec = quote!(::calm::codec::Codec);
    let header = input.impl_header(&codec, &codec);
    let encode = input
        .per_field(|m, span| quote_spanned!(span=> ::calm::codec::Codec::encode(&self.#m, enc);));
    let decode =
        input.per_field(|m, span| quote_spanned!(span=> #m: ::calm::codec::Codec::decode(dec)?,));
    let tagged = input.tag.map(|tag| {
        let header = input.impl_header(&quote!(::calm::codec::Tagged), &codec);
        quote! {
            #header {
                const TAG: u8 = #tag;
            }
        }
    });
    Ok(quote! {
        #header {
            fn encode(&self, enc: &mut ::calm::codec::Encoder) {
                #(#encode)*
            }

            fn decode(
                dec: &mut ::calm::codec::Decoder<'_>,
            ) -> ::core::result::Result<Self, ::calm::codec::DecodeError> {
                ::core::result::Result::Ok(Self { #(#decode)* })
            }
        }

        #tagged
    })
}

/// How the fields' summaries nest in the `Summary` tuple: flat up to
/// [`TUPLE_MAX`] fields, in tuples of tuples beyond.
#[derive(Debug, PartialEq)]
enum Shape {
    /// The summary of field number `.0`.
    Field(usize),
    /// A tuple of summaries (at most [`TUPLE_MAX`]).
    Tuple(Vec<Shape>),
}

impl Shape {
    /// The shape for `n` fields.
    fn of(n: usize) -> Self {
        let mut items: Vec<Shape> = (0..n).map(Shape::Field).collect();
        while items.len() > TUPLE_MAX {
            let mut rest = items.into_iter().peekable();
            items = Vec::new();
            while rest.peek().is_some() {
                items.push(Shape::Tuple(rest.by_ref().take(TUPLE_MAX).collect()));
            }
        }
        Shape::Tuple(items)
    }

    /// This shape as a type or an expression: `leaf(i)` for field `i`.
    fn to_tokens(&self, leaf: &dyn Fn(usize) -> TokenStream2) -> TokenStream2 {
        match self {
            Shape::Field(i) => leaf(*i),
            Shape::Tuple(items) => {
                let items = items.iter().map(|s| s.to_tokens(leaf));
                quote!((#(#items,)*))
            }
        }
    }

    /// Fills `out[i]` with the tuple indices that lead to field `i`.
    fn paths(&self, prefix: &mut Vec<usize>, out: &mut [Vec<usize>]) {
        match self {
            Shape::Field(i) => out[*i] = prefix.clone(),
            Shape::Tuple(items) => {
                for (k, item) in items.iter().enumerate() {
                    prefix.push(k);
                    item.paths(prefix, out);
                    prefix.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(expanded: syn::Result<TokenStream2>) -> String {
        match expanded {
            Ok(tokens) => panic!("expected an error, got {tokens}"),
            Err(e) => e.to_string(),
        }
    }

    /// Enums, unions and field-less structs are refused with a message
    /// naming the derive.
    #[test]
    fn unsupported_items_are_refused() {
        let e = error(expand_merge(&syn::parse_quote!(
            enum E {
                A,
            }
        )));
        assert!(
            e.contains("`#[derive(Merge)]` supports structs, not enums"),
            "{e}"
        );
        let e = error(expand_codec(&syn::parse_quote!(
            union U {
                a: u8,
            }
        )));
        assert!(e.contains("not unions"), "{e}");
        let e = error(expand_delta_merge(&syn::parse_quote!(
            struct Empty;
        )));
        assert!(e.contains("`Empty` has no state"), "{e}");
        let e = error(expand_merge(&syn::parse_quote!(
            struct S {
                #[calm(skip)]
                a: u8,
            }
        )));
        assert!(e.contains("no field attributes"), "{e}");
    }

    /// Tags must be 128 to 255, given once, and the only attribute.
    #[test]
    fn tags_are_checked() {
        for (attr, message) in [
            (quote!(#[calm(tag = 7)]), "128 to 255"),
            (quote!(#[calm(tag = 300)]), "128 to 255"),
            (quote!(#[calm(tag = 130, tag = 131)]), "given twice"),
            (quote!(#[calm(version = 2)]), "expected `tag = N`"),
        ] {
            let ast: DeriveInput = syn::parse_quote!(#attr struct S { a: u8 });
            let e = error(expand_codec(&ast));
            assert!(e.contains(message), "{attr}: {e}");
        }
        let ast: DeriveInput = syn::parse_quote!(
            #[calm(tag = 255)]
            struct S {
                a: u8,
            }
        );
        assert_eq!(
            Input::parse(&ast, "Codec").ok().and_then(|i| i.tag),
            Some(255)
        );
    }

    /// Up to 12 fields the summary is one flat tuple; beyond, tuples of at
    /// most 12 nest, and every field's path leads to its own summary.
    #[test]
    fn summary_shapes_nest_past_twelve() {
        let flat = Shape::of(3);
        assert_eq!(
            flat,
            Shape::Tuple(vec![Shape::Field(0), Shape::Field(1), Shape::Field(2)])
        );
        let big = Shape::of(150);
        let mut paths = vec![Vec::new(); 150];
        big.paths(&mut Vec::new(), &mut paths);
        assert_eq!(paths[0], [0, 0, 0]);
        assert_eq!(paths[13], [0, 1, 1]);
        assert_eq!(paths[149], [1, 0, 5]);
        let ty = big.to_tokens(&|i| quote!(F #i)).to_string();
        assert_eq!(ty.matches("F ").count(), 150);
    }

    /// A tuple struct is supported, its fields named by index.
    #[test]
    fn tuple_structs_expand() {
        let ast: DeriveInput = syn::parse_quote!(
            struct Pair<T>(T, u8);
        );
        let tokens = expand_merge(&ast)
            .map(|t| t.to_string())
            .unwrap_or_default();
        assert!(tokens.contains("self . 0"), "{tokens}");
        assert!(tokens.contains("T : :: calm :: Merge"), "{tokens}");
    }
}
