//! Names on the wire, written once. Every enum here serializes as, prints
//! as and is named in events by the same string, taken from one table.

/// Declares a fieldless enum whose variants have fixed wire names: serde
/// reads and writes the name, `as_str` and `Display` give it, `ALL` lists
/// the variants.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $wire:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
        $vis enum $name {
            $( $(#[$variant_meta])* #[serde(rename = $wire)] $variant ),*
        }

        impl $name {
            /// Every variant.
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $wire),*
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use wire_enum;
